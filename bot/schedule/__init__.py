"""Schedules, maintenance windows, the scheduler that fires them and approvals
collected ahead. Runs go through the command service like any request.
"""
