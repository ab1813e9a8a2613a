"""The reports wing: registry entries whose actions read (or drive) more than one system, so
that they belong to none of them. Each module (or package's ``adapter`` module) declares its
``ADAPTER``: gpu_usage (report.gpu_usage), fairshare (report.fairshare), drift/
(report.drift) and upgrades (slurm.driver_upgrade, with Prometheus' soak)."""
