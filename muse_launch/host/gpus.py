"""The host's GPUs as a value: each GPU's model, memory and the processes holding memory on it.

Read through NVML (nvidia-ml-py) on NVIDIA and the AMD SMI library on AMD, imported only when a
view is read (`import pynvml` alone costs ~70 ms); or from a saved view (`doctor --json`) named by
MUSE_LAUNCH_GPU_VIEW, which replays a user's report, or stands in for a GPU in tests.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from muse_launch.errors import UsageError

GPU_RELEASE_SECONDS = 10.0  # a dead process's memory is freed at once; tearing down 100+ GiB takes a moment

VIEW_ENV = "MUSE_LAUNCH_GPU_VIEW"
GIB = 1 << 30


def gib(n: int) -> str:
    return f"{n / GIB:.1f}"


def index_ranges(indices: Any) -> str:
    """0,1,2,3,6 -> "0-3, 6": how GPUs are named in messages."""
    runs: list[list[int]] = []
    for i in sorted(set(indices)):
        if runs and runs[-1][-1] == i - 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


@dataclass(frozen=True)
class GpuHolder:
    """A process holding memory on a GPU, as the driver reports it (its pid in the host's namespace)."""

    pid: int
    used_bytes: int | None  # None: the driver does not say (NVML_VALUE_NOT_AVAILABLE)
    command: str | None = None  # as read when the view was taken, so a replayed view still names it

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "used_bytes": self.used_bytes, "command": self.command}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> GpuHolder:
        return cls(int(d["pid"]), d.get("used_bytes"), d.get("command"))


@dataclass(frozen=True)
class Gpu:
    index: (
        int  # the driver's (PCI bus) order: what nvidia-smi shows, and CUDA with CUDA_DEVICE_ORDER=PCI_BUS_ID
    )
    name: str  # "NVIDIA H200", "AMD Instinct MI355X"
    total_bytes: int
    used_bytes: int  # all of it, the driver's own reserve included (~0.6 GiB on an idle H200)
    holders: tuple[GpuHolder, ...] = ()
    uuid: str | None = None
    pci_bus_id: str | None = None

    @property
    def free_bytes(self) -> int:
        return max(self.total_bytes - self.used_bytes, 0)

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "name": self.name,
            "total_bytes": self.total_bytes,
            "used_bytes": self.used_bytes,
            "holders": [h.to_json() for h in self.holders],
            "uuid": self.uuid,
            "pci_bus_id": self.pci_bus_id,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Gpu:
        return cls(
            int(d["index"]),
            str(d["name"]),
            int(d["total_bytes"]),
            int(d["used_bytes"]),
            tuple(GpuHolder.from_json(h) for h in d.get("holders", ())),
            d.get("uuid"),
            d.get("pci_bus_id"),
        )


@dataclass(frozen=True)
class GpuView:
    """What one read of the host found. No GPUs and a reason: no library, no driver, a CPU host."""

    source: str  # nvml | amdsmi | none | the saved view's path
    gpus: tuple[Gpu, ...] = ()
    driver: str | None = None
    unavailable: str | None = None  # why nothing could be read
    read_seconds: float = 0.0

    @property
    def available(self) -> bool:
        return self.unavailable is None

    def gpu(self, index: int) -> Gpu | None:
        return next((g for g in self.gpus if g.index == index), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "driver": self.driver,
            "unavailable": self.unavailable,
            "gpus": [g.to_json() for g in self.gpus],
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any], source: str | None = None) -> GpuView:
        d = d.get("gpu_view", d)  # `doctor --json` writes the view under "gpu_view"
        return cls(
            source or str(d.get("source", "saved")),
            tuple(Gpu.from_json(g) for g in d.get("gpus", ())),
            d.get("driver"),
            d.get("unavailable"),
        )

    def save(self, path: Path) -> None:
        """Atomically: a reader in another process (`down` polling the view) sees the old view or the new one,
        never a half-written file."""
        from muse_launch.files import replace_file

        replace_file(Path(path), (json.dumps(self.to_json(), indent=2) + "\n").encode(), mode=0o644)

    @classmethod
    def load(cls, path: Path) -> GpuView:
        try:
            return cls.from_json(json.loads(path.read_text()), source=str(path))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise UsageError(
                f"{VIEW_ENV}={path}: not a GPU view written by `muse-launch doctor --json` ({e})"
            ) from e


def command_of(pid: int) -> str | None:
    """A GPU holder's command line, secret-looking flags' values hidden (it may be anyone's)."""
    from muse_launch.proc.masks import command_line

    try:
        proc = psutil.Process(pid)
        return command_line(proc.cmdline())[:100] or proc.name()
    except psutil.Error:
        return None  # gone, or in another PID namespace (a container)


def _nvml_processes(pynvml, query, handle) -> list:
    """A GPU's processes; none where the driver will not list them (NotSupported under vGPU): its memory used
    still counts, only its holders go unnamed."""
    try:
        return query(handle)
    except pynvml.NVMLError:
        return []


def _nvml_view() -> GpuView:
    import pynvml  # imported here: CPU hosts and `validate` never pay for it

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        return GpuView("nvml", unavailable=f"NVML: {e}")
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            processes: dict[int, int | None] = {}
            # A process with a CUDA and a graphics context is in both lists, with the same memory.
            for proc in [
                *_nvml_processes(pynvml, pynvml.nvmlDeviceGetComputeRunningProcesses, handle),
                *_nvml_processes(pynvml, pynvml.nvmlDeviceGetGraphicsRunningProcesses, handle),
            ]:
                seen = processes.get(proc.pid)
                processes[proc.pid] = (
                    seen if proc.usedGpuMemory is None else max(seen or 0, proc.usedGpuMemory)
                )
            gpus.append(
                Gpu(
                    index,
                    _text(pynvml.nvmlDeviceGetName(handle)),
                    memory.total,
                    memory.used,
                    tuple(GpuHolder(pid, used, command_of(pid)) for pid, used in sorted(processes.items())),
                    _text(pynvml.nvmlDeviceGetUUID(handle)),
                    _text(pynvml.nvmlDeviceGetPciInfo(handle).busId),
                )
            )
        return GpuView("nvml", tuple(gpus), driver=_text(pynvml.nvmlSystemGetDriverVersion()))
    except pynvml.NVMLError as e:
        return GpuView("nvml", unavailable=f"NVML: {e}")
    finally:
        pynvml.nvmlShutdown()


def _amd_view() -> GpuView:
    try:
        import amdsmi  # not a dependency: it comes with ROCm, matched to the installed driver
    except ImportError:
        return GpuView("amdsmi", unavailable="AMD SMI: the amdsmi module is not installed")
    try:
        amdsmi.amdsmi_init(amdsmi.AmdSmiInitFlags.INIT_AMD_GPUS)
    except Exception as e:  # AmdSmiLibraryException and friends, whose names vary by ROCm release
        return GpuView("amdsmi", unavailable=f"AMD SMI: {e}")
    try:
        vram = amdsmi.AmdSmiMemoryType.VRAM
        gpus = []
        for index, handle in enumerate(amdsmi.amdsmi_get_processor_handles()):
            holders = []
            try:
                entries = amdsmi.amdsmi_get_gpu_process_list(handle)
            except Exception:  # not supported here (a VM, a partition): the memory used still counts
                entries = []
            for entry in entries:
                info = entry if isinstance(entry, dict) else amdsmi.amdsmi_get_gpu_process_info(handle, entry)
                used = (info.get("memory_usage") or {}).get("vram_mem")
                holders.append(
                    GpuHolder(
                        int(info["pid"]),
                        used if isinstance(used, int) else None,
                        command_of(int(info["pid"])),
                    )
                )
            gpus.append(
                Gpu(
                    index,
                    amdsmi.amdsmi_get_gpu_asic_info(handle)["market_name"],
                    amdsmi.amdsmi_get_gpu_memory_total(handle, vram),
                    amdsmi.amdsmi_get_gpu_memory_usage(handle, vram),
                    tuple(holders),
                    pci_bus_id=amdsmi.amdsmi_get_gpu_device_bdf(handle),
                )
            )
        return GpuView("amdsmi", tuple(gpus))
    except Exception as e:
        return GpuView("amdsmi", unavailable=f"AMD SMI: {e}")
    finally:
        amdsmi.amdsmi_shut_down()


def read_gpu_view(environ: Mapping[str, str] = os.environ) -> GpuView:
    """A saved view where MUSE_LAUNCH_GPU_VIEW names one; else NVML, else AMD SMI; else why neither."""
    started = time.perf_counter()
    if saved := environ.get(VIEW_ENV):
        view = GpuView.load(Path(saved))
    else:
        view = _nvml_view()
        if not view.available:
            amd = _amd_view()
            view = (
                amd
                if amd.available
                else GpuView("none", unavailable=f"{view.unavailable}; {amd.unavailable}")
            )
    return GpuView(view.source, view.gpus, view.driver, view.unavailable, time.perf_counter() - started)


GpuReader = Callable[[], GpuView]
