"""The topology file: its schema (model.py), its loading with line numbers and ${env:...} (load.py), the
hardware
profiles (hardware.py) and the runtime defaults (defaults.py)."""
