"""Proposals from Alertmanager alerts: a firing alert becomes a proposed runbook run.
Runs go through the command service like any request.
"""
