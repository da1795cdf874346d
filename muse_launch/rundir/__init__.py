"""The run directory of a deployment on this host: its state (state.py, read back through
state_schema.py as hostile input), the lifecycle of roles and deployments, the role logs and their caps."""
