"""From a request to an ended execution: planning, approval rules, the execution rows
and their transitions, locks, confirmations, checks and the engine. No surface lives here.
"""
