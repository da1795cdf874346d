"""The command bodies, the top layer beside cli.py: each module registers its commands on the CLI's app.
Nothing below imports this package (tests/unit/test_layers.py)."""
