"""The Linux process layer: spawning a role in its own session (and cgroup), knowing a process again by its
start time, stopping a group with deadlines, whose listener answers a port, and masking secrets in command
lines."""
