"""Check kinds (one module each) and the registry the planner and engine use.
A check reads; it never changes a system.
"""
