"""The words and grammar both halves share: durations, canonical JSON, refusals.

Sits below ``bot`` and ``adapters`` and imports neither; nothing here touches a system.
"""
