"""slurmrestd: backend (operations and refusals per API version), client (HTTP, versions,
errors), auth (the JWT), parse (its JSON, which scontrol --json prints too), jobs (a command
on a node as a batch job)."""
