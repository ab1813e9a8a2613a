"""Slurm's C API through pyslurm 25.11: backend (the operations), records (its objects as
the backend's records)."""
