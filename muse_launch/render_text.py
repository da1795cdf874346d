"""Human renderings of a Plan: text, shell commands and docker run lines."""

from __future__ import annotations

import shlex
from typing import Callable

from .plan.spec import LaunchSpec, Plan
from .topology.hardware import PROFILES
from .topology.model import Topology

Redact = Callable[[str], str]


def _wave_of(plan: Plan) -> dict[str, int]:
    return {name: i + 1 for i, wave in enumerate(plan.waves) for name in wave}


def plan_text(plan: Plan, redact: Redact, topology: Topology) -> str:
    out = [f"deployment {plan.name}: {len(plan.specs)} processes in {len(plan.waves)} waves"]
    for i, wave in enumerate(plan.waves, 1):
        out.append(f"\nwave {i}: {', '.join(wave)}")
        for name in wave:
            spec = plan.spec(name)
            probe = spec.probe
            target = " then ".join(probe.paths) if probe.paths else probe.kind.value
            ports = ", ".join(f"{k} {v}" for k, v in spec.ports.items()) or "none"
            out.append(f"  {spec.name} ({spec.kind}, {spec.engine})")
            out.append(f"    gpus:  {','.join(map(str, spec.gpus)) or '-'}    ports: {ports}    url: {spec.url or '-'}")
            out.append(f"    ready: {target} (timeout {probe.timeout:g}s)"
                       + (f"    after: {', '.join(spec.depends_on)}" if spec.depends_on else ""))
            for key, value in spec.env.items():
                out.append(f"    env:   {key}={redact(value)}")
            out.append("    argv:  " + _wrapped(spec.argv, redact, indent="             "))
    return "\n".join(out)


def _wrapped(argv: tuple[str, ...], redact: Redact, indent: str = "  ") -> str:
    """Quoted argv, one `--flag value...` per line like the cookbook's commands."""
    lines: list[list[str]] = [[]]
    for arg in argv:
        if arg.startswith("--") and lines[-1] and any(a.startswith("--") or len(lines) == 1 for a in lines[-1][:1]):
            lines.append([])
        lines[-1].append(shlex.quote(redact(arg)))
    return (" \\\n" + indent).join(" ".join(words) for words in lines)


def plan_shell(plan: Plan, redact: Redact, topology: Topology) -> str:
    waves = _wave_of(plan)
    out = [f"# {plan.name}: run each command in its own shell, waiting for each wave to be ready"]
    for spec in plan.specs:
        env = " ".join(f"{k}={shlex.quote(redact(v))}" for k, v in spec.env.items())
        out.append(f"\n# wave {waves[spec.name]}: {spec.name} ({spec.kind}), ready when "
                   f"{_ready_hint(spec)}")
        out.append((env + " \\\n  " if env else "") + _wrapped(spec.argv, redact))
    return "\n".join(out)


def _ready_hint(spec: LaunchSpec) -> str:
    if spec.probe.paths and spec.url:
        return " and ".join(f"GET {spec.url}{p} is {spec.probe.status}" for p in spec.probe.paths)
    return f"{spec.probe.kind.value} probe passes"


def plan_docker(plan: Plan, redact: Redact, topology: Topology) -> str:
    profile = PROFILES[topology.hardware]
    waves = _wave_of(plan)
    out = [f"# {plan.name}: docker run lines, host network, in start order"]
    for spec in plan.specs:
        out.append(f"\n# wave {waves[spec.name]}: {spec.name} ({spec.kind})")
        image = profile.vllm_image if spec.engine in ("vllm", "vllm-router") else profile.sglang_image
        if spec.engine == "command" or image is None:
            out.append("# runs on the host (no image for it): " + " ".join(shlex.quote(redact(a)) for a in spec.argv))
            continue
        argv = list(spec.argv)
        docker = ["docker", "run", "-d", "--name", f"{plan.name}-{spec.name}".replace("@", "-"),
                  "--network", "host", "--ipc", "host", "--shm-size", "32g"]
        if spec.gpus:
            docker += list(profile.docker_gpu_args)
        for key, value in spec.env.items():
            docker += ["-e", f"{key}={redact(value)}"]
        docker += ["-v", "~/.cache/huggingface:/root/.cache/huggingface"]
        if spec.engine == "vllm" and argv[:2] == ["vllm", "serve"]:
            argv = argv[2:]  # the vLLM image's entrypoint is `vllm serve`
        elif spec.engine in ("vllm", "vllm-router"):
            docker += ["--entrypoint", argv[0]]
            argv = argv[1:]
        docker.append(image)
        out.append(_wrapped(tuple(docker + argv), redact))
    return "\n".join(out)
