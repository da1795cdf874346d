"""`top`: each role's /metrics read live (prom.py parses, collect.py gathers, view.py draws; the command is
muse_launch/commands/top.py); docs/top.md is the user's reference."""
