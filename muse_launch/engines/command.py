"""`kind: command` roles: a whole argv with {port}, {host} and {gpus} placeholders."""

from __future__ import annotations

from ..readiness import Probe, ProbeKind
from .base import Context, Engine, Instance, Rendered


class Command(Engine):
    NAME = "command"
    DEFAULT_LAUNCHER: tuple[str, ...] = ()
    RELEASE = None
    DISTRIBUTIONS: tuple[str, ...] = ()
    MODULES: tuple[str, ...] = ()
    KEY_FLAGS: dict[str, tuple[str, ...]] = {}
    SHADOWED: dict[str, str] = {}
    WIRING: dict[str, str] = {}
    PORT_FLAGS: dict[str, str] = {}

    def render(self, inst: Instance, ctx: Context) -> Rendered:
        values = {
            "port": "" if inst.port is None else str(inst.port),
            "host": inst.bind,
            "gpus": ",".join(map(str, inst.gpus)),
        }
        args = tuple(_fill(a, values) for a in inst.role.command or ())
        probe = Probe(ProbeKind.TCP, timeout=600.0) if inst.port else Probe(ProbeKind.PROCESS)
        return Rendered(args, {"http": inst.port} if inst.port else {}, probe)


def _fill(arg: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        arg = arg.replace("{" + key + "}", value)
    return arg


ENGINE = Command()
