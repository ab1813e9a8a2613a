"""Helpers for deploy/lab/lab: a throw-away Slurm + MariaDB lab on loopback."""
