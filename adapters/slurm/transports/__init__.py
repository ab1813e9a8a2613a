"""How the bot reaches Slurm, one module (or package) per transport behind the SlurmBackend
Protocol: cli (Slurm's programs, the default), rest/ (slurmrestd), pyslurm/ (the C API);
choice (make_backend: the one the configuration names)."""
