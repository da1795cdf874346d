"""The run directory of a deployment on this host: its state (state.py, whose records are state.json's one
description, read back as hostile input), the lifecycle of roles and deployments, the role logs and their
caps."""
