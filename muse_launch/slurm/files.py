"""A SLURM deployment's files, under its run directory (which the nodes must share, as they share
the venv): the batch script as submitted, the checked topology, the job, the placement the batch
host chose, its heartbeat, the two words `down` and the supervisor exchange, and the requests and
answers of `scale` and `restart` (slurm/request_files.py)."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from muse_launch.files import PlantedLink, read_nofollow, replace_file
from muse_launch.rundir.state import RunDir

HEARTBEAT_SECONDS = 1.0
HEARTBEAT_STALE = 5.0  # a supervisor silent this long is gone


@dataclass(frozen=True)
class SlurmFiles:
    run_dir: RunDir

    @property
    def dir(self) -> Path:
        return self.run_dir.path / "slurm"

    @property
    def script(self) -> Path:
        return self.dir / "job.sbatch"

    @property
    def topology(self) -> Path:
        return self.dir / "topology.yaml"

    @property
    def source(self) -> Path:
        """The path of the file the user gave `up` (the batch host plans from the copy beside it)."""
        return self.dir / "source"

    @property
    def job(self) -> Path:
        return self.dir / "job.json"

    @property
    def placement(self) -> Path:
        return self.dir / "placement.json"

    @property
    def batch_log(self) -> Path:
        return self.dir / "batch.out"

    @property
    def heartbeat(self) -> Path:
        return self.dir / "heartbeat"

    @property
    def down_request(self) -> Path:
        return self.dir / "down-request"

    @property
    def done(self) -> Path:
        return self.dir / "done"

    @property
    def changes(self) -> Path:
        """`scale` and `restart`'s requests and the supervisor's answers (slurm/request_files.py)."""
        return self.dir / "changes"

    def exists(self) -> bool:
        return self.job.exists()

    def write_text(self, path: Path, text: str) -> None:
        """Atomically, and replacing (never writing through) a link planted there (muse_launch/files.py)."""
        replace_file(path, text.encode(), root=self.run_dir.home)

    def write_json(self, path: Path, data: Any) -> None:
        self.write_text(path, json.dumps(data, indent=2))

    def read_text(self, path: Path) -> str:
        return read_nofollow(path, root=self.run_dir.home).decode()

    def read_json(self, path: Path) -> dict[str, Any] | None:
        """An object, or None where the file is gone or damaged (bounded before parsing: bounded_json.py)."""
        from muse_launch.bounded_json import Damaged
        from muse_launch.rundir.state import MAX_STATE_BYTES, load_state_json

        try:
            data = load_state_json(read_nofollow(path, root=self.run_dir.home, limit=MAX_STATE_BYTES + 1))
        except (FileNotFoundError, PlantedLink, Damaged):
            return None
        return data if isinstance(data, dict) else None

    def job_id(self) -> str | None:
        data = self.read_json(self.job)
        return data.get("job_id") if data else None

    def supervisor_alive(self) -> bool:
        """The batch host's supervisor beats every second; across hosts a pid means nothing."""
        try:
            return time.time() - float(self.read_text(self.heartbeat).strip()) < HEARTBEAT_STALE
        except (FileNotFoundError, PlantedLink, UnicodeDecodeError, ValueError):
            return False

    def clear_run(self) -> None:
        """Before a new submission: nothing of the last job may be read as this one's."""
        self.dir.mkdir(parents=True, exist_ok=True)
        for path in (self.placement, self.heartbeat, self.down_request, self.done, self.batch_log, self.job):
            path.unlink(missing_ok=True)
        shutil.rmtree(self.changes, ignore_errors=True)
