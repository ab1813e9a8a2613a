"""The drift report (``report.drift``): each pool's nodes against the driver, firmware and
Slurm versions the pool should run; judging.py compares, sources.py reads, report.py writes,
adapter.py is its registry entry."""
