"""The runtime on this host, above the process layer (muse_launch/proc/): the run directory (state, lifecycle,
logfiles, logs), the supervision engine (supervisor, seams, probe, wiring, start_policy) and the local backend
(local, up, down, status, gpus, progress, output, explain)."""
