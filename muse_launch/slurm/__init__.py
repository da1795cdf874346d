"""`up --on slurm`: one job per deployment, the same supervisor on the batch host, each role a
named job step on its node (README "SLURM")."""
