"""The host's GPU view: read through NVML or AMD SMI (fake libraries here), saved and replayed as JSON."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from muse_launch.errors import UsageError
from muse_launch.host.gpus import VIEW_ENV, Gpu, GpuHolder, GpuView, index_ranges, read_gpu_view
from muse_launch.topology.hardware import PROFILES

GIB = 1 << 30
H200 = int(140.4 * GIB)


def test_gpus_are_named_in_ranges():
    assert index_ranges([0, 1, 2, 3, 6, 8, 9]) == "0-3, 6, 8-9"
    assert index_ranges([4]) == "4" and index_ranges([]) == ""


@pytest.mark.parametrize(
    "profile, device, matches",
    [
        ("h200", "NVIDIA H200", True),
        ("h200", "NVIDIA H200 NVL", True),
        ("h200", "NVIDIA H100 80GB HBM3", False),
        ("b300", "NVIDIA B300 SXM6 AC", True),
        ("b300", "NVIDIA GB300", False),
        ("gb300", "NVIDIA GB300", True),
        ("b200", "NVIDIA B300", False),
        ("mi355x", "AMD Instinct MI355X", True),
        ("mi350x", "AMD Instinct MI355X", False),
        ("cpu", "NVIDIA H200", False),
    ],
)
def test_a_profile_knows_its_gpu_by_the_drivers_name(profile, device, matches):
    assert PROFILES[profile].matches_gpu(device) is matches


def test_a_view_survives_json_and_a_doctor_report_replays(tmp_path: Path):
    view = GpuView(
        "nvml",
        (
            Gpu(
                0,
                "NVIDIA H200",
                H200,
                101 * GIB,
                (GpuHolder(564, 100 * GIB, "python3 serve.py"),),
                "GPU-0",
                "00000000:18:00.0",
            ),
            Gpu(1, "NVIDIA H200", H200, GIB),
        ),
        "580.159.04",
    )
    view.save(tmp_path / "view.json")
    assert GpuView.load(tmp_path / "view.json") == GpuView(
        str(tmp_path / "view.json"), view.gpus, view.driver
    )
    (tmp_path / "doctor.json").write_text(json.dumps({"gpu_view": view.to_json(), "ports": []}))
    replayed = read_gpu_view({VIEW_ENV: str(tmp_path / "doctor.json")})
    assert (
        replayed.gpus == view.gpus
        and replayed.gpu(0).free_bytes == H200 - 101 * GIB
        and replayed.gpu(2) is None
    )
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(
        UsageError, match=f"{VIEW_ENV}=.*bad.json: not a GPU view written by `muse-launch doctor"
    ):
        read_gpu_view({VIEW_ENV: str(tmp_path / "bad.json")})


class NVMLError(Exception):
    pass


def fake_pynvml(gpus: list[dict], init_error: str | None = None) -> types.ModuleType:
    """The parts of nvidia-ml-py the reader calls, over a list of GPUs."""
    nvml = types.ModuleType("pynvml")
    nvml.NVMLError = NVMLError
    calls = []

    def init():
        calls.append("init")
        if init_error:
            raise NVMLError(init_error)

    def processes(key):
        return lambda h: [
            types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in gpus[h].get(key, [])
        ]

    nvml.nvmlInit = init
    nvml.nvmlShutdown = lambda: calls.append("shutdown")
    nvml.nvmlDeviceGetCount = lambda: len(gpus)
    nvml.nvmlDeviceGetHandleByIndex = lambda i: i
    nvml.nvmlDeviceGetName = lambda h: gpus[h]["name"]
    nvml.nvmlDeviceGetUUID = lambda h: f"GPU-{h}"
    nvml.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=f"00000000:{h:02X}:00.0".encode())
    nvml.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(
        total=gpus[h]["total"], used=gpus[h]["used"]
    )
    nvml.nvmlDeviceGetComputeRunningProcesses = processes("compute")
    nvml.nvmlDeviceGetGraphicsRunningProcesses = processes("graphics")
    nvml.nvmlSystemGetDriverVersion = lambda: "580.159.04"
    nvml.calls = calls
    return nvml


def test_nvml_is_read_into_a_view(monkeypatch):
    nvml = fake_pynvml(
        [
            {
                "name": "NVIDIA H200",
                "total": H200,
                "used": 101 * GIB,
                "compute": [(564, 100 * GIB), (777, None)],
                "graphics": [(564, 100 * GIB)],
            },
            {"name": "NVIDIA H200", "total": H200, "used": GIB},
        ]
    )
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    view = read_gpu_view({})
    assert view.source == "nvml" and view.driver == "580.159.04" and view.available
    assert [g.name for g in view.gpus] == ["NVIDIA H200", "NVIDIA H200"]
    # One process in both the compute and the graphics list is one holder, its memory counted once.
    assert [(h.pid, h.used_bytes) for h in view.gpu(0).holders] == [(564, 100 * GIB), (777, None)]
    assert view.gpu(0).pci_bus_id == "00000000:00:00.0" and view.gpu(1).holders == ()
    assert nvml.calls == ["init", "shutdown"]


def test_a_process_list_the_driver_will_not_give_leaves_the_memory_counted(monkeypatch):
    nvml = fake_pynvml(
        [{"name": "NVIDIA H200", "total": H200, "used": 50 * GIB, "compute": [(564, 49 * GIB)]}]
    )

    def not_supported(handle):
        raise NVMLError("Not Supported")

    nvml.nvmlDeviceGetGraphicsRunningProcesses = not_supported
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    gpu = read_gpu_view({}).gpu(0)
    assert gpu.free_bytes == H200 - 50 * GIB and [h.pid for h in gpu.holders] == [564]


def test_no_library_answering_is_a_view_with_the_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([], init_error="NVML Shared Library Not Found"))
    monkeypatch.setitem(sys.modules, "amdsmi", None)  # import amdsmi raises ImportError
    view = read_gpu_view({})
    assert not view.available and view.gpus == ()
    assert (
        view.unavailable == "NVML: NVML Shared Library Not Found; AMD SMI: the amdsmi module is not installed"
    )


def test_amd_smi_is_read_when_nvml_finds_no_driver(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([], init_error="Driver Not Loaded"))
    amd = types.ModuleType("amdsmi")
    amd.AmdSmiInitFlags = types.SimpleNamespace(INIT_AMD_GPUS=2)
    amd.AmdSmiMemoryType = types.SimpleNamespace(VRAM=0)
    amd.amdsmi_init = lambda flags: None
    amd.amdsmi_shut_down = lambda: None
    amd.amdsmi_get_processor_handles = lambda: ["h0", "h1"]
    amd.amdsmi_get_gpu_asic_info = lambda h: {"market_name": "AMD Instinct MI355X"}
    amd.amdsmi_get_gpu_memory_total = lambda h, kind: 288 * GIB
    amd.amdsmi_get_gpu_memory_usage = lambda h, kind: 200 * GIB if h == "h0" else GIB
    amd.amdsmi_get_gpu_device_bdf = lambda h: "0000:05:00.0"
    amd.amdsmi_get_gpu_process_list = lambda h: (
        [{"pid": 42, "memory_usage": {"vram_mem": 199 * GIB}}] if h == "h0" else []
    )
    monkeypatch.setitem(sys.modules, "amdsmi", amd)
    view = read_gpu_view({})
    assert view.source == "amdsmi" and len(view.gpus) == 2
    assert view.gpu(0).holders == (GpuHolder(42, 199 * GIB, view.gpu(0).holders[0].command),)
    assert PROFILES["mi355x"].matches_gpu(view.gpu(1).name) and view.gpu(1).free_bytes == 287 * GIB
