"""`top`: each role's /metrics read live (prom.py parses, collect.py gathers, view.py draws, command.py the
command); docs/top.md is the user's reference."""
