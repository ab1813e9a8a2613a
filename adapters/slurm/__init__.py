"""Slurm: the backend Protocol, its CLI, slurmrestd and pyslurm implementations, and the
``slurm.*`` actions.

    config = SlurmConfig(slurm_conf="/etc/slurm/slurm.conf")
    actions = SlurmActions(make_backend(config), config).all()
"""
