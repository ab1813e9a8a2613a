"""GPU Runbook Bot: versioned, approved, audited runbooks for GPU clusters."""

__version__ = "0.1.0"
