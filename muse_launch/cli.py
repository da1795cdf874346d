"""The command line: parse, call the core, print. Every exception maps to an exit code in run().

Start-up time is part of the interface (`--help` < 0.15 s): this module imports typer and the
standard library only, and each command imports what it needs inside its body; the runtime
commands (commands/run.py) follow the same rule. Help and usage errors are click's plain text
(typer's rich formatting costs ~70 ms of imports on every call).
"""

from __future__ import annotations

import os
import sys

import typer

from .errors import first_command, report, wants_json

# `import httpx` also imports httpx's own command line (click, rich, pygments: ~50 ms of CPU, a
# fifth of `up -d`'s start) unless that import fails, which httpx handles (`except ImportError`).
# We never run httpx's CLI; the runtime, `status` and `smoke` import httpx for its client only.
sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]

app = typer.Typer(
    name="muse-launch",
    help="Bring a disaggregated LLM serving topology up from one file, and down with nothing left behind.",
    no_args_is_help=True,
    add_completion=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


# Modules that add commands: each exposes register(app) and imports typer only at module level (its
# commands import what they need when they run), so `--help` stays fast and a missing package is named
# by the command that needs it. Add a module here rather than importing it above.
COMMAND_MODULES = (
    "muse_launch.commands.file",
    "muse_launch.commands.run",
    "muse_launch.commands.live",
    "muse_launch.commands.export",
    "muse_launch.commands.host",
    "muse_launch.commands.top",
    "muse_launch.commands.bench",
    "muse_launch.commands.autoscale",
)
_registered: list[str] = []


def _register_commands() -> None:
    import importlib

    for name in COMMAND_MODULES:
        if name not in _registered:
            importlib.import_module(name).register(app)
            _registered.append(name)


def _exit_code(code: object) -> int:
    """SystemExit's code as a process would see it (sys.exit("text") prints the text, exits 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def run(argv: list[str] | None = None) -> int:
    """Run one command in this process and return its exit code; never raises (tests call this)."""
    args = sys.argv[1:] if argv is None else [str(a) for a in argv]
    try:
        _register_commands()
        app(args=args, prog_name="muse-launch")
    except SystemExit as exc:  # click's usage errors (2), typer.Exit, --help
        return _exit_code(exc.code)
    except BaseException as exc:  # noqa: BLE001  the one error table: errors.explain
        names = [c.name or c.callback.__name__ for c in app.registered_commands]
        if wants_json(args) and not isinstance(exc, KeyboardInterrupt):
            return _report_json(exc, first_command(args, names))
        return report(exc, first_command(args, names))
    return 0


def _report_json(exc: BaseException, command: str | None) -> int:
    """--json asked: the error as one JSON object on stdout (the traceback on stderr with
    MUSE_LAUNCH_DEBUG=1)."""
    import json
    import traceback

    from .errors import as_json, debugging

    code, out = as_json(exc, command)
    if debugging():
        traceback.print_exception(exc, file=sys.stderr)
    try:
        print(json.dumps(out, indent=2), flush=True)
    except (BrokenPipeError, ValueError):
        pass
    return code


def main(argv: list[str] | None = None) -> None:
    """The console script: click handles usage errors (exit 2) and Ctrl-C (130); errors.explain the rest."""
    from .signals import reset_inherited

    reset_inherited()  # Ctrl-C stops it, whatever its parent ignored or blocked (signals.py)
    code = run(argv)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, ValueError):  # the reader left: say nothing more, and no "Exception ignored"
            setattr(sys, "stdout" if stream is sys.stdout else "stderr", open(os.devnull, "w"))  # noqa: SIM115
            code = code or 1
    threading = sys.modules.get("threading")
    if threading is None or threading.active_count() == 1:
        # Nothing else runs: skip the interpreter's teardown, which frees every module one by one (~30 ms
        # of CPU after `validate` or `up`), once the exit handlers have run and the output is flushed.
        import atexit

        atexit._run_exitfuncs()
        os._exit(code)
    sys.exit(code)
