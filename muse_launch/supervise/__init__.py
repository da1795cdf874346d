"""The supervision engine: start roles wave by wave as early as each engine allows (plan/start_policy.py),
poll them ready (probe.py), check their wiring (wiring.py), restart them by policy, stop them in waves
(supervisor.py), and change a running deployment one change at a time (changes.py, brought by
control.py; workers.py speaks the worker API of the routers); its seams (seams.py) are parameters, so that
this host and a SLURM batch host share it."""
