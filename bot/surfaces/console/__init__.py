"""The read-only web console at /ui of ``runbook serve``: executions, their audit trail, nodes,
the chain and runbooks, for auditors and on-call (docs/console.md). Server-rendered with
Jinja2, plain forms, readable without JavaScript."""
