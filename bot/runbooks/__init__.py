"""Runbooks as data: the model, parameters, templating, loading, versions, the action
catalogue and the node inventory. Knows nothing of executions, approvals or surfaces.
"""
