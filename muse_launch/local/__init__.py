"""The local host as a backend (backend.py): `up` here (up.py, its GPU preflight gpus.py, progress and
output), `down` (down.py), `status` (status.py) and the addresses explained (explain.py)."""
