"""`doctor [FILE]`: what this host offers, for a bug report: its GPUs (model, memory, holders), engine
versions, and with a FILE whether its GPUs and ports are free. `--json` carries the GPU view as read, which
MUSE_LAUNCH_GPU_VIEW=FILE replays in `up`, `down`, `status` and `doctor`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from muse_launch.host.gpus import GpuReader, GpuView, gib
from muse_launch.host.versions import installed_versions
from muse_launch.local.gpu_runtime import Owners, gpu_needs, gpu_problems, one_host
from muse_launch.proc.ports import can_bind, port_holder
from muse_launch.rundir.state import recorded_role, running_deployments
from muse_launch.topology.hardware import PROFILES


def doctor_report(file: Path | None, read: GpuReader) -> dict[str, Any]:
    view = read()
    owners = Owners(running_deployments())
    report: dict[str, Any] = {
        "gpu_view": view.to_json(),
        "holders": {str(h.pid): owners.label(h) for g in view.gpus for h in g.holders},
    }
    if file is None:
        return report
    from muse_launch.core import load_plan

    loaded = load_plan(file)
    plan, topology = loaded.plan, loaded.loaded.topology
    report["file"] = str(file)
    report["hardware"] = topology.hardware
    report["engines"] = installed_versions(plan)
    if view.available and PROFILES[topology.hardware].has_gpus:
        problems, notes = gpu_problems(
            one_host(gpu_needs(plan, topology)), PROFILES[topology.hardware], view, owners
        )
        report["gpu_check"] = {"problems": [{"text": p.text, "fix": p.fix} for p in problems], "notes": notes}
    report["ports"] = [
        {
            "role": spec.name,
            "name": name,
            "port": port,
            "host": spec.bind,
            "free": free,
            "holder": None
            if free
            else port_holder(port, spec.bind, mask=loaded.redact, recorded=recorded_role),
        }
        for spec in plan.specs
        for name, port in spec.ports.items()
        for free in [can_bind(spec.bind, port)]
    ]
    return report


def doctor_lines(report: dict[str, Any]) -> list[str]:
    view = GpuView.from_json(report["gpu_view"])
    lines = []
    if not view.available:
        lines.append(f"GPUs: none readable ({view.unavailable})")
    else:
        driver = f", driver {view.driver}" if view.driver else ""
        profiles = sorted({p.name for g in view.gpus for p in PROFILES.values() if p.matches_gpu(g.name)})
        lines.append(
            f"GPUs: {len(view.gpus)} ({view.source}{driver}); hardware profile: "
            f"{', '.join(profiles) or 'none matches'}"
        )
        for gpu in view.gpus:
            holders = "; ".join(
                f"{report['holders'].get(str(h.pid), f'pid {h.pid}')}"
                f"{f' {gib(h.used_bytes)} GiB' if h.used_bytes is not None else ''}"
                for h in gpu.holders
            )
            lines.append(
                f"  GPU {gpu.index}: {gpu.name}, {gib(gpu.total_bytes)} GiB, {gib(gpu.free_bytes)} free"
                f"{', held by ' + holders if holders else ''}"
            )
    if "file" not in report:
        return lines
    engines = report.get("engines")
    if engines is not None:
        lines.append(
            "engines: " + (", ".join(f"{e} {v or 'not installed'}" for e, v in engines.items()) or "none")
        )
    check = report.get("gpu_check")
    if check is not None:
        lines.append(
            f"{report['file']} (hardware: {report['hardware']}) on these GPUs: "
            f"{'ok' if not check['problems'] else str(len(check['problems'])) + ' problems'}"
        )
        for problem in check["problems"]:
            lines += [f"  {problem['text']}", f"    fix: {problem['fix']}"]
        lines += [f"  note: {n}" for n in check["notes"]]
    lines.append(f"ports of {report['file']}:")
    for p in report["ports"]:
        where = "" if p["host"] in ("127.0.0.1", "0.0.0.0", "::", "") else f" on {p['host']}"
        lines.append(
            f"  {p['role']} {p['name']} {p['port']}{where}: "
            f"{'free' if p['free'] else 'in use by ' + p['holder']}"
        )
    return lines


def print_doctor(file: Path | None, as_json: bool, read: GpuReader, echo: Callable[[str], None]) -> None:
    import json

    report = doctor_report(file, read)
    if as_json:
        echo(json.dumps(report, indent=2))
    else:
        for line in doctor_lines(report):
            echo(line)
