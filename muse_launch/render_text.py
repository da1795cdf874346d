"""Human renderings of a Plan: text, shell commands and docker run lines.

The shell and docker renderings are pasted into shells: every value from the file is quoted for the
shell (`quote`: shlex's quoting, or bash's $'...' for a value holding a control character, so that
neither a paste nor the terminal showing it runs or hides anything), an environment name is written only
if it is one (the loader refuses others), and a comment line is made by `comment`, which cannot end the
line early (docs/security.md).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable

from .engines import image_carrier, worker_facts
from .plan.spec import LaunchSpec, Plan
from .topology.grammar import ENV_NAME
from .topology.hardware import PROFILES
from .topology.model import Topology

Redact = Callable[[str], str]
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def one_line(text: str) -> str:
    """`text` with each control character (CR, LF, NUL, ESC...) written as an escape: it cannot end a line."""
    return _UNPRINTABLE.sub(
        lambda m: f"\\x{ord(m[0]):02x}" if ord(m[0]) < 0x100 else f"\\u{ord(m[0]):04x}", text
    )


def quote(value: str) -> str:
    """`value` as one shell word. With a control character in it (CR, ESC, BEL...) the word is bash's
    $'...' with each such character escaped: printed, it cannot move the cursor over what runs."""
    if not _UNPRINTABLE.search(value):
        return shlex.quote(value)
    body = value.replace("\\", "\\\\").replace("'", "\\'")
    # \xHH is a byte to bash, whatever the locale: a character past ASCII is written as its UTF-8 bytes
    escape = lambda m: "".join(f"\\x{b:02x}" for b in m[0].encode())  # noqa: E731
    return "$'" + _UNPRINTABLE.sub(escape, body) + "'"


def comment(text: str) -> str:
    """A shell comment line: whatever `text` holds, the next line is not part of it."""
    return "# " + one_line(text)


def env_name(name: str) -> str:
    """`name`, checked again: one that is not a variable name is a bug (the loader refuses it)."""
    if not ENV_NAME.fullmatch(name):
        raise ValueError(f"not an environment variable name: {name!r}")
    return name


def assignment(name: str, value: str) -> str:
    """`NAME=value` for a shell, the value quoted."""
    return f"{env_name(name)}={quote(value)}"


def _wave_of(plan: Plan) -> dict[str, int]:
    return {name: i + 1 for i, wave in enumerate(plan.waves) for name in wave}


def start_steps(plan: Plan, start_after: dict[str, tuple[str, ...]] | None) -> tuple[tuple[str, ...], ...]:
    """The roles that start together, in order: the plan's waves, or those a start policy gives (a role
    starts once every role it waits for is ready)."""
    if start_after is None:
        return plan.waves
    step: dict[str, int] = {}
    for wave in plan.waves:  # waves are in dependency order: what a role waits for is placed before it
        for name in wave:
            step[name] = 1 + max((step[d] for d in start_after.get(name, ()) if d in step), default=0)
    last = max(step.values(), default=0)
    return tuple(tuple(n for w in plan.waves for n in w if step[n] == i) for i in range(1, last + 1))


def plan_text(
    plan: Plan,
    redact: Redact,
    topology: Topology,
    policy: str | None = None,
    start_after: dict[str, tuple[str, ...]] | None = None,
) -> str:
    """`policy`/`start_after`: how `up` will start it (plan/start_policy.py); without them, wave by
    wave."""
    steps = start_steps(plan, start_after)
    after = start_after or {s.name: s.depends_on for s in plan.specs}
    head = f"deployment {plan.name}: {len(plan.specs)} processes in {len(steps)} waves"
    if policy:
        together = [", ".join(w) for w in steps if len(w) > 1]
        head += f"; start: {policy}" + (f" ({'; '.join(together)} start together)" if together else "")
    out = [head]
    for i, wave in enumerate(steps, 1):
        out.append(f"\nwave {i}: {', '.join(wave)}")
        for name in wave:
            spec = plan.spec(name)
            probe = spec.probe
            target = " then ".join(probe.paths) if probe.paths else probe.kind.value
            ports = ", ".join(f"{k} {v}" for k, v in spec.ports.items()) or "none"
            waits = after.get(name, ())
            late = [d for d in spec.depends_on if d not in waits]
            out.append(f"  {spec.name} ({spec.kind}, {spec.engine})")
            out.append(
                f"    gpus:  {','.join(map(str, spec.gpus)) or '-'}    ports: {ports}    url: "
                f"{spec.url or '-'}"
            )
            out.append(
                f"    ready: {target} (timeout {probe.timeout:g}s)"
                + (f"    after: {', '.join(waits)}" if waits else "")
                + (f"    wired to {', '.join(late)}, not waiting for it" if late else "")
            )
            for key, value in spec.env.items():
                out.append(f"    env:   {key}={redact(value)}")
            out.append("    argv:  " + _wrapped(spec.argv, redact, indent="             "))
    return "\n".join(out)


def _wrapped(argv: tuple[str, ...], redact: Redact, indent: str = "  ") -> str:
    """Quoted argv, one `--flag value...` per line like the cookbook's commands."""
    lines: list[list[str]] = [[]]
    for arg in argv:
        if (
            arg.startswith("--")
            and lines[-1]
            and any(a.startswith("--") or len(lines) == 1 for a in lines[-1][:1])
        ):
            lines.append([])
        lines[-1].append(quote(redact(arg)))
    return (" \\\n" + indent).join(" ".join(words) for words in lines)


def plan_shell(plan: Plan, redact: Redact, topology: Topology) -> str:
    waves = _wave_of(plan)
    out = [comment(f"{plan.name}: run each command in its own shell, waiting for each wave to be ready")]
    for spec in plan.specs:
        env = " ".join(assignment(k, redact(v)) for k, v in spec.env.items())
        out.append(
            "\n"
            + comment(
                f"wave {waves[spec.name]}: {spec.name} ({spec.kind}), ready when {redact(_ready_hint(spec))}"
            )
        )
        out.append((env + " \\\n  " if env else "") + _wrapped(spec.argv, redact))
    return "\n".join(out)


def _ready_hint(spec: LaunchSpec) -> str:
    if spec.probe.paths and spec.url:
        return " and ".join(f"GET {spec.url}{p} is {spec.probe.status}" for p in spec.probe.paths)
    return f"{spec.probe.kind.value} probe passes"


HF_CACHE_MOUNT = "~/.cache/huggingface:/root/.cache/huggingface"  # unquoted: the shell expands ~


def plan_docker(plan: Plan, redact: Redact, topology: Topology) -> str:
    """`docker run` lines with the cookbook's and the recipe's images, on the host network the
    cookbook's EPD example shares; GPUs are picked inside the container by the visible-devices
    variable, so the same indices as `plan` apply."""
    profile = PROFILES[topology.hardware]
    waves = _wave_of(plan)
    out = [comment(f"{plan.name}: docker run lines, host network, in start order")]
    for spec in plan.specs:
        where = f", on {spec.node} ({redact(spec.host)})" if spec.node else ""
        out.append("\n" + comment(f"wave {waves[spec.name]}: {spec.name} ({spec.kind}){where}"))
        image = image_for(spec, profile)
        if image is None:
            program = redact(spec.argv[0]) if spec.argv else spec.engine
            out.append(comment(f"no image ships {program}: run it on the host"))
            env = " ".join(assignment(k, redact(v)) for k, v in spec.env.items())
            out.append((env + " \\\n  " if env else "") + _wrapped(spec.argv, redact))
            continue
        argv = list(spec.argv)
        options = [
            f"docker run -d --name {quote((plan.name + '-' + spec.name).replace('@', '-'))}",
            "--network host --ipc host --shm-size 32g",
        ]
        if spec.gpus and profile.docker_gpu_args:
            options.append(" ".join(profile.docker_gpu_args))
        facts = worker_facts(spec.engine)
        if facts and facts.privileged:
            options.append("--privileged")
        options += [f"-e {quote(f'{env_name(k)}={redact(v)}')}" for k, v in spec.env.items()]
        options.append(f"-v {HF_CACHE_MOUNT}")
        if facts and facts.entrypoint:
            if tuple(argv[: len(facts.entrypoint)]) == facts.entrypoint:
                argv = argv[len(facts.entrypoint) :]
            else:
                options.append(f"--entrypoint {quote(argv.pop(0))}")
        options.append(image)
        out.append(" \\\n  ".join(options) + (" \\\n  " + _wrapped(tuple(argv), redact) if argv else ""))
    return "\n".join(out)


def image_for(spec: LaunchSpec, profile) -> str | None:
    """The image that ships the role's program: the engine's image for this hardware, or for a router the
    image of the worker engine that carries it (engines' FACTS); the others run on the host."""
    carrier = image_carrier(spec.engine)
    return carrier.image(profile) if carrier else None
