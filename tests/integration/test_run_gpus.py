"""GPUs as real as ports, on the CPU: real processes, and a saved GPU view (MUSE_LAUNCH_GPU_VIEW) standing
in for NVML that says which of them hold GPU memory. scripts/gpu_check.sh does the same on a GPU host."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest
from harness import free_ports, port_open, stand_in, wait_for

from muse_launch.host.gpus import VIEW_ENV, Gpu, GpuHolder, GpuView

pytestmark = pytest.mark.integration

GIB = 1 << 30
TOTAL = int(139.8 * GIB)
IDLE = int(0.6 * GIB)


def view(holders: list[GpuHolder] = ()) -> GpuView:
    return GpuView(
        "nvml",
        (Gpu(0, "NVIDIA H200", TOTAL, IDLE + sum(h.used_bytes for h in holders), tuple(holders)),),
        "580.159.04",
    )


@pytest.fixture
def gpu_view(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The view the CLI reads in place of NVML: one idle H200 until a test says otherwise."""
    path = tmp_path / "gpu-view.json"
    view().save(path)
    monkeypatch.setenv(VIEW_ENV, str(path))
    return path


def gpu_role(port: int, *flags: str, **role) -> dict:
    return stand_in(port, *flags, gpus=[0], mem_fraction=0.5, **role)


def test_up_refuses_a_gpu_held_by_another_process_before_anything_starts(deployment, gpu_view):
    (port,) = free_ports(1)
    foreign = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "serve.py"])
    try:
        view([GpuHolder(foreign.pid, int(100.6 * GIB))]).save(gpu_view)
        result = deployment.cli(
            "up", deployment.write({"worker": gpu_role(port)}, hardware="h200"), "--detach"
        )
    finally:
        foreign.kill()
        foreign.wait()
    assert result.returncode == 1, result.stdout + result.stderr
    held = (
        f"GPU 0: 100.6 of 139.8 GiB held by pid {foreign.pid} ({sys.executable} -c import time; "
        "time.sleep(600) "
        f"serve.py); 38.6 GiB is free, and worker needs 69.9 GiB (mem_fraction 0.5)"
    )
    assert held in result.stderr
    assert (
        f"    fix: stop pid {foreign.pid} (" in result.stderr
        and "mem_fraction to 0.27 or less" in result.stderr
    )
    assert not (deployment.run_dir / "logs").exists() and not port_open(port) and deployment.alive() == []


def test_a_b300_file_on_an_h200_host_is_refused_naming_both(deployment, gpu_view):
    (port,) = free_ports(1)
    result = deployment.cli("up", deployment.write({"worker": gpu_role(port)}, hardware="b300"), "--detach")
    assert result.returncode == 1, result.stdout + result.stderr
    assert (
        "hardware: b300: the file is written for NVIDIA B300 (8 x 288 GB), but GPU 0 of this host is NVIDIA "
        "H200\n    fix: write the file for this host (`hardware: h200`" in result.stderr
    )
    assert deployment.alive() == []
    skipped = deployment.cli(
        "up", deployment.write({"worker": gpu_role(port)}, hardware="b300"), "--detach", "--skip-gpu-check"
    )
    assert skipped.returncode == 0 and "GPU check skipped: --skip-gpu-check" in skipped.stdout.splitlines(), (
        skipped
    )
    assert deployment.cli("down", deployment.name).returncode == 0


def test_status_shows_a_roles_gpu_memory_and_down_returns_once_it_is_free(deployment, gpu_view):
    """The role's process, its setsid grandchild and its retitled child hold GPU memory; the supervisor is
    SIGKILLed; `down` still finds them all, and returns once the (fake) driver lists none of them."""
    (port,) = free_ports(1)
    up = deployment.cli(
        "up",
        deployment.write(
            {"engine": gpu_role(port, "--setsid-grandchild", "--retitled-child", stop={"grace": 2})},
            hardware="h200",
        ),
        "--detach",
    )
    assert up.returncode == 0, up.stdout + up.stderr
    assert any(
        line.startswith("GPU 0: NVIDIA H200, with the memory their roles need (")
        for line in up.stdout.splitlines()
    ), up.stdout
    log = deployment.run_dir / "logs" / "engine.log"
    escaped = int(wait_for(lambda: re.search(r"escaped (\d+)", log.read_text()))[1])
    retitled = int(wait_for(lambda: re.search(r"retitled (\d+)", log.read_text()))[1])
    leader = deployment.role("engine")["pid"]
    holders = [GpuHolder(leader, 40 * GIB), GpuHolder(escaped, 15 * GIB), GpuHolder(retitled, 5 * GIB)]
    view(holders).save(gpu_view)

    status = deployment.status()
    [engine] = status["roles"]
    assert engine["gpu_memory"] == {"total_bytes": 60 * GIB, "by_gpu": {"0": 60 * GIB}}
    table = deployment.cli("status", deployment.name)
    assert "gpu memory" in table.stdout and "60.0 GiB" in table.stdout, table.stdout

    psutil.Process(status["supervisor_pid"]).send_signal(signal.SIGKILL)

    def driver_frees_dead_processes() -> None:  # NVML lists a process until it is gone, then frees its memory
        wait_for(
            lambda: (
                not any(
                    psutil.pid_exists(h.pid) and psutil.Process(h.pid).status() != psutil.STATUS_ZOMBIE
                    for h in holders
                )
            ),
            timeout=30,
        )
        view().save(gpu_view)

    driver = threading.Thread(target=driver_frees_dead_processes)
    driver.start()
    down = deployment.cli("down", deployment.name)
    driver.join()
    assert down.returncode == 0, down.stdout + down.stderr
    assert down.stdout.rstrip().endswith("GPU 0 free"), down.stdout
    assert deployment.alive() == []


def test_doctor_writes_the_view_it_read_and_replays_it(deployment, gpu_view, tmp_path, monkeypatch):
    port, busy = free_ports(2)
    marked = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        view([GpuHolder(marked.pid, 10 * GIB, "python3 serve.py")]).save(gpu_view)
        file = deployment.write({"worker": gpu_role(port, "--also-listen", busy)}, hardware="h200")
        report = deployment.cli("doctor", file, "--json")
        assert report.returncode == 0, report.stderr
        saved = tmp_path / "report.json"
        saved.write_text(report.stdout)
        assert (
            json.loads(report.stdout)["gpu_view"]["gpus"]
            == view([GpuHolder(marked.pid, 10 * GIB, "python3 serve.py")]).to_json()["gpus"]
        )
        monkeypatch.setenv(VIEW_ENV, str(saved))
        with __import__("socket").create_server(("127.0.0.1", port)):
            text = deployment.cli("doctor", file)
    finally:
        marked.kill()
        marked.wait()
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[:2] == [
        "GPUs: 1 (" + str(saved) + ", driver 580.159.04); hardware profile: h200",
        f"  GPU 0: NVIDIA H200, 139.8 GiB, 129.2 free, held by pid {marked.pid} (python3 serve.py) 10.0 GiB",
    ]
    assert f"{file} (hardware: h200) on these GPUs: ok" in lines
    assert any(re.match(rf"  worker http {port}: in use by pid \d+ \(", line) for line in lines), lines


def test_validate_and_plan_never_read_the_hosts_gpus(deployment, tmp_path, monkeypatch):
    (port,) = free_ports(1)
    monkeypatch.setenv(VIEW_ENV, str(tmp_path / "no-such-view.json"))
    file = deployment.write({"worker": gpu_role(port)}, hardware="h200")
    assert deployment.cli("validate", file).returncode == 0
    assert deployment.cli("plan", file).returncode == 0
    assert deployment.cli("doctor").returncode == 2  # a user error: the named view is missing
