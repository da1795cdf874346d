"""The runtime on this host: the process layer (process, identity, cgroups, listeners, ports), the run directory
(state, lifecycle, logfiles, logs, masks), the supervision engine (supervisor, seams, probe, wiring,
start_policy) and the local backend (local, up, down, status, gpus, progress, output, explain)."""
