"""Read a topology file: YAML with line numbers, `${env:NAME}` secrets, `--set` overrides."""

from __future__ import annotations

import difflib
import errno
import hashlib
import os
import re
import stat
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from ..errors import TopologyError
from . import grammar
from .model import Topology
from .scalars import keep_text

Path_ = tuple[str | int, ...]
ENV_REF = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}")
REDACTED = "***"
STR_TAG = "tag:yaml.org,2002:str"
MAX_FILE_BYTES = (
    1 << 20
)  # a topology is a few KiB; checked before reading, so /dev/zero or 50 MB cost nothing
MAX_NODES = 100_000  # values after aliases are expanded: a billion-laughs file stops here, not in MemoryError


@dataclass(frozen=True)
class LoadedTopology:
    topology: Topology
    source: Path
    lines: Mapping[Path_, int] = field(default_factory=dict)
    secrets: frozenset[str] = frozenset()
    # each whole value that held ${env:...}, as substituted -> as written with *** for each reference
    secret_values: Mapping[str, str] = field(default_factory=dict)
    # the same values -> as written, `${env:NAME}` and all: what a later command resolves in its environment
    secret_sources: Mapping[str, str] = field(default_factory=dict)
    overrides: Mapping[Path_, str] = field(default_factory=dict)  # a key --set gave -> that --set argument
    env_names: frozenset[str] = frozenset()  # each NAME of a `${env:NAME}` the file and --set refer to
    sha256: str | None = None  # of the bytes read: a later reader of the path knows it read the same file

    def line_of(self, path: Path_) -> int | None:
        """The line of the deepest part of `path` that appears in the file."""
        for end in range(len(path), -1, -1):
            line = self.lines.get(tuple(path[:end]))
            if line is not None:
                return line
        return None

    def where(self, path: Path_) -> str:
        if given := set_argument(self.overrides, path):
            return f"{self.source}: --set {given}"  # the value is the argument's, not the file's line
        line = self.line_of(path)
        return f"{self.source}:{line}" if line else str(self.source)

    def redact(self, text: str) -> str:
        for value in sorted(self.secret_values, key=len, reverse=True):
            if len(value) >= SHORT_SECRET:
                text = text.replace(value, self.secret_values[value])
        return redact(text, self.secrets)


SHORT_SECRET = 8  # shorter secrets are masked only as a whole token: a secret `1` must not mangle 127.0.0.1
_TOKEN_EDGE = r"\s'\"=,;:/@()\[\]{}<>"  # not '.': a secret 1 is no part of 127.0.0.1


def redact(text: str, secrets: Iterable[str]) -> str:
    for secret in sorted(secrets, key=len, reverse=True):
        if len(secret) >= SHORT_SECRET:
            text = text.replace(secret, REDACTED)
        else:
            text = re.sub(f"(?<![^{_TOKEN_EDGE}]){re.escape(secret)}(?![^{_TOKEN_EDGE}])", REDACTED, text)
    return text


_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]+")


def set_argument(overrides: Mapping[Path_, str], path: Path_) -> str | None:
    """The --set argument that gave the value at PATH (or a mapping above it), if one did."""
    return next((overrides[path[:end]] for end in range(len(path), 0, -1) if path[:end] in overrides), None)


def dotted(path: Iterable[str | int]) -> str:
    """`roles.prefill.args[2]`; a key outside letters, digits, '_' and '-' is quoted (`roles.'app\\n'`)."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
            continue
        text = part if isinstance(part, str) and _PLAIN_KEY.fullmatch(part) else repr(part)
        out += f".{text}" if out else text
    return out


def load_topology(
    source: str | os.PathLike[str], sets: Iterable[str] = (), environ: Mapping[str, str] | None = None
) -> LoadedTopology:
    path = Path(source)
    raw = read_regular_file(path)
    try:
        text = raw.decode()
    except UnicodeDecodeError as exc:
        utf16 = raw[:2] in (b"\xff\xfe", b"\xfe\xff")
        line = raw.count(b"\n", 0, exc.start) + 1
        raise TopologyError(
            [
                f"{path}:{line}: not UTF-8 text"
                + (" (it is UTF-16)" if utf16 else f" (byte {raw[exc.start]:#04x})")
            ],
            fix="save the file as UTF-8",
        ) from None
    loaded = parse_topology(text, path, sets, os.environ if environ is None else environ)
    return replace(loaded, sha256=hashlib.sha256(raw).hexdigest())


def read_regular_file(path: Path) -> bytes:
    """The file's bytes, if it is a regular file of at most MAX_FILE_BYTES; a FIFO, a device or a
    directory is refused before a byte is read (O_NONBLOCK: opening a FIFO with no writer must not hang)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise MissingFile(path) from None
    except OSError as exc:
        raise TopologyError([f"{path}: cannot read the topology file: {exc.strerror or exc}"]) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            if stat.S_ISDIR(info.st_mode):
                raise TopologyError([f"{path}: cannot read the topology file: {os.strerror(errno.EISDIR)}"])
            kind = (
                "a FIFO"
                if stat.S_ISFIFO(info.st_mode)
                else "a socket"
                if stat.S_ISSOCK(info.st_mode)
                else "a device"
                if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode)
                else "special"
            )
            raise TopologyError([f"{path}: cannot read the topology file: it is {kind}, not a regular file"])
        if info.st_size > MAX_FILE_BYTES:
            raise TopologyError(
                [
                    f"{path}: not a topology file: {info.st_size} bytes, more than the "
                    f"{MAX_FILE_BYTES} a topology file may hold"
                ]
            )
        chunks, size = [], 0
        while size <= MAX_FILE_BYTES:  # the file may grow after fstat: never read past the limit
            chunk = os.read(fd, MAX_FILE_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > MAX_FILE_BYTES:
            raise TopologyError(
                [
                    f"{path}: not a topology file: more than the {MAX_FILE_BYTES} bytes a "
                    f"topology file may hold"
                ]
            )
        return b"".join(chunks)
    except OSError as exc:
        raise TopologyError([f"{path}: cannot read the topology file: {exc.strerror or exc}"]) from None
    finally:
        os.close(fd)


class MissingFile(TopologyError):
    """No file at PATH: `error:` and a `fix:` naming the nearest topology file there is (exit 2)."""

    def __init__(self, path: Path):
        near = nearest_files(path)
        fix = (
            f"did you mean {' or '.join(near)}?"
            if near
            else "give the path of a topology file (the repository's are in topologies/ and examples/)"
        )
        super().__init__([f"{path}: no such file"], fix=fix)

    def lines(self) -> list[str]:
        return [f"error: {self.problems[0]}", f"  fix: {self.fix}"]


def nearest_files(path: Path, limit: int = 1) -> list[str]:
    """Topology files whose names are closest to PATH's: beside it, and in ./topologies and ./examples
    (`epd-b300.yaml` typed from the repository's root is `topologies/epd-b300.yaml`)."""
    places = dict.fromkeys([path.parent, Path("topologies"), Path("examples"), path.parent / "topologies"])
    candidates: dict[str, str] = {}
    for place in places:
        try:
            for entry in sorted(place.iterdir())[:1000]:
                if entry.suffix in (".yaml", ".yml") and entry.is_file():
                    shown = str(entry if place != Path(".") else Path(entry.name))
                    candidates.setdefault(shown, entry.name)
        except OSError:
            continue
    by_name: dict[str, list[str]] = {}
    for shown, name in candidates.items():
        by_name.setdefault(name, []).append(shown)
    names = difflib.get_close_matches(path.name, list(by_name), n=limit, cutoff=0.75)
    return [shown for name in names for shown in by_name[name]][:limit]


def parse_topology(
    text: str, path: Path, sets: Iterable[str] = (), environ: Mapping[str, str] = {}
) -> LoadedTopology:
    texts: dict[Path_, str] = {}  # each plain scalar YAML did not read as a string, as written
    data, lines = _read_yaml(text, path, texts)
    problems: list[str] = []
    overrides: dict[Path_, str] = {}
    for assignment in sets:
        problem = _apply_set(data, assignment, texts)
        if problem:
            problems.append(problem)
        else:
            overrides[tuple(assignment.partition("=")[0].split("."))] = assignment
    given = [tuple(a.partition("=")[0].split(".")) for a in sets]
    problems += keep_text(
        data,
        texts,
        lambda at: (
            f"--set {dotted(at)}" if any(at[: len(g)] == g for g in given) else _where(path, lines, at)
        ),
    )
    secrets: set[str] = set()
    values: dict[str, str] = {}
    sources: dict[str, str] = {}
    names = frozenset(_env_names(data))
    data = _substitute_env(data, (), environ, secrets, problems, path, lines, values, sources)
    if problems:
        raise TopologyError(problems)
    loaded_secrets = frozenset(s for s in secrets if s)
    try:
        topology = Topology.model_validate(data)
    except ValidationError as exc:
        # Schema messages may quote a value that came from ${env:...}.
        problems = _explain(exc, data, path, lines, overrides)
        raise TopologyError([redact(p, loaded_secrets) for p in problems]) from None
    clashes = _name_clashes(topology, path, lines)
    if clashes:
        raise TopologyError(clashes)
    return LoadedTopology(
        topology,
        path,
        lines,
        loaded_secrets,
        values,
        secret_sources=sources,
        overrides=overrides,
        env_names=names,
    )


def _env_names(value: Any) -> Iterable[str]:
    if isinstance(value, dict):
        for v in value.values():
            yield from _env_names(v)
    elif isinstance(value, list):
        for v in value:
            yield from _env_names(v)
    elif isinstance(value, str):
        yield from ENV_REF.findall(value)


def _name_clashes(topology: Topology, path: Path, lines: Mapping[Path_, int]) -> list[str]:
    """Two roles whose generated names meet (`w` with replicas: 2 makes w-1, beside a role `w-1`):
    one would silently replace the other's process, log and cgroup."""
    roles = {name: (role.replicas, role.nodes) for name, role in topology.roles.items()}
    out = []
    for role, other, name in grammar.name_clashes(roles):
        makes = grammar.instance_names(other, *roles[other])
        how = (
            ""
            if name in makes + grammar.instance_names(role, *roles[role])
            else "; a container or exported name writes '@' as '-'"
        )
        out.append(
            f"{_where(path, lines, ('roles', role))}: the name {name!r} is also one of roles.{other}'s "
            f"(roles.{other} makes {', '.join(makes)}{how})\n  fix: rename roles.{role} or roles.{other}"
        )
    return out


def _where(path: Path, lines: Mapping[Path_, int], at: Path_) -> str:
    line = next((lines[at[:end]] for end in range(len(at), -1, -1) if at[:end] in lines), None)
    return f"{path}:{line}: {dotted(at)}" if line else f"{path}: {dotted(at)}"


class _Loader(yaml.SafeLoader):
    """Safe YAML whose mapping keys are the text as written: `on:` is the key 'on', `1:` the key '1'
    (every mapping of a topology is keyed by names)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        self.flatten_mapping(node)
        mapping: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = (
                key_node.value
                if isinstance(key_node, yaml.ScalarNode)
                else self.construct_object(key_node, deep)
            )
            if not isinstance(key, typing.Hashable):
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    "found unhashable key",
                    key_node.start_mark,
                )
            mapping[key] = self.construct_object(value_node, deep=deep)
        return mapping


def _read_yaml(text: str, path: Path, texts: dict[Path_, str] | None = None) -> tuple[Any, dict[Path_, int]]:
    loader: yaml.SafeLoader | None = None
    lines: dict[Path_, int] = {(): 1}
    duplicates: list[str] = []
    try:
        loader = _Loader(text)  # inside: the reader rejects NUL and other control characters here
        node = loader.get_single_node()
        # Before constructing: construction flattens `<<` merges into the nodes in place.
        if node is not None:
            _record_lines(node, (), lines, duplicates, path, budget=[MAX_NODES], texts=texts)
        data = loader.construct_document(node) if node is not None else None
    except yaml.reader.ReaderError as exc:  # a control character (NUL...): the reader knows only its offset
        code = exc.character if isinstance(exc.character, int) else ord(exc.character)
        raise TopologyError(
            [
                f"{path}:{text.count(chr(10), 0, exc.position) + 1}: not valid YAML: control "
                f"character U+{code:04X} is not allowed"
            ]
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        context, start = getattr(exc, "context", None), getattr(exc, "context_mark", None)
        if context and start and (not mark or start.line != mark.line):
            problem += f" ({context} that starts on line {start.line + 1})"
        raise TopologyError([f"{where}: not valid YAML: {problem}"]) from None
    except RecursionError:
        raise TopologyError([f"{path}: nested too deeply to be a topology file"]) from None
    except _TooManyValues as exc:
        raise TopologyError(
            [f"{path}:{exc.line}: {dotted(exc.at) or 'top level'}: {exc}"],
            fix="write the values out instead of nesting aliases",
        ) from None
    except ValueError as exc:  # an integer of more digits than Python converts
        raise TopologyError([f"{path}: not a topology file: {exc}"]) from None
    finally:
        if loader is not None:
            loader.dispose()
    if not isinstance(data, dict):
        raise TopologyError(
            [f"{path}:1: a topology file is a mapping with version, name, hardware and roles"]
        )
    if duplicates:
        raise TopologyError(duplicates)
    return data, lines


class _TooManyValues(ValueError):
    def __init__(self, node: yaml.Node, at: Path_):
        super().__init__(f"aliases expand the file to more than {MAX_NODES} values")
        self.line, self.at = node.start_mark.line + 1, at


def _record_lines(
    node: yaml.Node,
    at: Path_,
    lines: dict[Path_, int],
    duplicates: list[str],
    path: Path,
    inside: frozenset[int] = frozenset(),
    budget: list[int] | None = None,
    texts: dict[Path_, str] | None = None,
) -> None:
    """Walk the document as the constructed data will be, aliases expanded: record each key's line (and in
    `texts` each scalar YAML does not read as a string, as written), collect duplicate keys and
    self-containing aliases, and stop past `budget` values (billion laughs)."""
    if budget is not None:
        budget[0] -= 1
        if budget[0] < 0:
            raise _TooManyValues(node, at)
    if id(node) in inside:
        duplicates.append(
            f"{path}:{node.start_mark.line + 1}: {dotted(at)}: an alias inside its own anchor "
            f"repeats forever; copy the values instead"
        )
        return
    inside = inside | {id(node)}
    if isinstance(node, yaml.ScalarNode) and texts is not None and node.tag != STR_TAG:
        texts[at] = node.value
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        merged: list[yaml.Node] = []
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                duplicates.append(
                    f"{path}:{key_node.start_mark.line + 1}: {dotted(at) or 'top level'}: a key "
                    f"must be a plain name, not a list or a mapping"
                )
                continue
            key = key_node.value
            if key == "<<":
                merged += value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
                continue
            line = key_node.start_mark.line + 1
            if key in seen:
                duplicates.append(
                    f"{path}:{line}: {dotted(at + (key,))}: key given twice (first on line "
                    f"{seen[key]}); keep one"
                )
            seen.setdefault(key, line)
            lines[at + (key,)] = line
            _record_lines(value_node, at + (key,), lines, duplicates, path, inside, budget, texts)
        # `<<: *defaults` keys not overridden here: point at the anchor that gives them.
        for source in merged:
            if isinstance(source, yaml.MappingNode):
                for key_node, value_node in source.value:
                    if key_node.value != "<<" and at + (key_node.value,) not in lines:
                        lines[at + (key_node.value,)] = key_node.start_mark.line + 1
                        _record_lines(
                            value_node, at + (key_node.value,), lines, [], path, inside, budget, texts
                        )
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            lines[at + (index,)] = item.start_mark.line + 1
            _record_lines(item, at + (index,), lines, duplicates, path, inside, budget, texts)


def _apply_set(data: dict[str, Any], assignment: str, texts: dict[Path_, str] | None = None) -> str | None:
    key, sep, raw = assignment.partition("=")
    if not sep or not key:
        return f"--set {assignment}: write KEY=VALUE, e.g. --set roles.prefill.mem_fraction=0.75"
    parts = key.split(".")
    target: Any = data
    for depth, part in enumerate(parts[:-1]):
        if not isinstance(target, dict):
            break
        if part not in target:
            if depth == 1 and parts[0] == "roles":  # a typo'd role name would start a new, empty role
                return f"--set {assignment}: no role {part!r}; roles: {', '.join(target)}"
            target[part] = {}  # `rehearse.ready_after` in a file without `rehearse:`; the schema checks it
        elif isinstance(target[part], dict):  # a copy: a mapping YAML aliases (`env: *nvlink`) is shared,
            target[part] = dict(target[part])  # and --set roles.decode.env.X=1 must not change prefill's
        target = target[part]
    if not isinstance(target, dict):
        return f"--set {assignment}: {'.'.join(parts[:-1])} is not a mapping"
    at = tuple(parts)
    if texts is not None:
        for old in [p for p in texts if p[: len(at)] == at]:  # what the file said there is replaced
            del texts[old]
    try:
        target[parts[-1]] = _set_value(raw, at, texts)
    except yaml.YAMLError:
        target[parts[-1]] = raw
    except (RecursionError, _TooManyValues, _SelfAlias):
        return (
            f"--set {key}=...: the value nests too deeply or its aliases repeat forever or expand past "
            f"{MAX_NODES} values; write the value out"
        )
    except ValueError as exc:  # an integer of more digits than Python converts
        return f"--set {key}=...: {exc}"
    return None


class _SelfAlias(ValueError):
    pass


def _set_value(raw: str, at: Path_, texts: dict[Path_, str] | None = None) -> Any:
    """A --set value read as YAML, under the file's limits: no alias inside its own anchor, no explosion."""
    loader = _Loader(raw)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        problems: list[str] = []
        _record_lines(node, at, {}, problems, Path("--set"), budget=[MAX_NODES], texts=texts)
        if problems:
            raise _SelfAlias(problems[0])
        return loader.construct_document(node)
    finally:
        loader.dispose()


# The variables this repository's own files use, and the command that sets them.
_VLLM_SETUP = 'eval "$(bash scripts/vllm_cpu_setup.sh)"'
_SGLANG_SETUP = 'eval "$(bash scripts/sglang_cpu_setup.sh)"'
SETS_ENV = {
    **dict.fromkeys(("MUSE_LAUNCH_TINY_MODEL", "MUSE_LAUNCH_VLLM_PYTHON"), _VLLM_SETUP),
    **dict.fromkeys(("MUSE_LAUNCH_SGLANG_MODEL", "MUSE_LAUNCH_SGLANG_PYTHON"), _SGLANG_SETUP),
}


def _substitute_env(
    value: Any,
    at: Path_,
    environ: Mapping[str, str],
    secrets: set[str],
    problems: list[str],
    path: Path,
    lines: Mapping[Path_, int],
    values: dict[str, str] | None = None,
    sources: dict[str, str] | None = None,
) -> Any:
    if isinstance(value, dict):
        return {
            k: _substitute_env(v, at + (k,), environ, secrets, problems, path, lines, values, sources)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [
            _substitute_env(v, at + (i,), environ, secrets, problems, path, lines, values, sources)
            for i, v in enumerate(value)
        ]
    if not isinstance(value, str) or "${env:" not in value:
        return value

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in environ:
            line = lines.get(at) or lines.get(at[:-1])
            how = (
                f"run `{SETS_ENV[name]}` first (it sets {name})"
                if name in SETS_ENV
                else f"export {name}=... before running muse-launch"
            )
            problems.append(f"{path}:{line}: {dotted(at)}: ${{env:{name}}} is not set; {how}")
            return ""
        secrets.add(environ[name])
        return environ[name]

    out = ENV_REF.sub(replace, value)
    if values is not None and out:
        values[out] = ENV_REF.sub(REDACTED, value)
    if sources is not None and out:
        sources[out] = value
    return out


def _explain(
    exc: ValidationError,
    data: Any,
    path: Path,
    lines: Mapping[Path_, int],
    overrides: Mapping[Path_, str] = {},
) -> list[str]:
    out: list[str] = []
    seen: set[Path_] = set()
    for error in exc.errors(include_url=False):
        loc = _data_path(error["loc"], data)
        if loc in seen:
            continue  # a union reports each alternative: the first says enough
        seen.add(loc)
        line = next((lines[loc[:end]] for end in range(len(loc), -1, -1) if loc[:end] in lines), None)
        where = f"{path}:{line}" if line else str(path)
        if given := set_argument(overrides, loc):
            where = f"{path}: --set {given}"  # the value is the argument's, not the file's line
        kind = error["type"]
        if kind == "extra_forbidden":
            key = str(loc[-1])
            valid = sorted(_model_at(loc[:-1]).model_fields)
            near = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
            hint = f"did you mean {near[0]!r}?" if near else f"valid keys: {', '.join(valid)}"
            out.append(f"{where}: {dotted(loc)}: unknown key {key!r}; {hint}")
        elif kind == "missing":
            hint = {
                "kind": "; add kind: encoder | prefill | decode | worker | router | command",
                "version": "; add version: 1",
            }.get(str(loc[-1]), "")
            out.append(
                f"{where}: {dotted(loc[:-1]) or '(top level)'}: missing required key {loc[-1]!r}{hint}"
            )
        elif kind in ("literal_error", "enum") and isinstance(error.get("input"), str):
            choices = re.findall(r"'([^']*)'", str(error.get("ctx", {}).get("expected", "")))
            near = difflib.get_close_matches(error["input"].lower(), choices, n=1, cutoff=0.5)
            hint = f"did you mean {near[0]!r}?" if near else f"use one of {', '.join(choices)}"
            out.append(
                f"{where}: {dotted(loc) or '(top level)'}: {error['input']!r} is not one of "
                f"{', '.join(choices)}; {hint}"
            )
        elif kind != "value_error" and not isinstance(error.get("input"), (dict, list)):
            out.append(
                f"{where}: {dotted(loc) or '(top level)'}: {error['input']!r} is not valid here: "
                f"{error['msg'][0].lower()}{error['msg'][1:]}"
            )
        else:
            message = error["msg"].removeprefix("Value error, ")
            fix = getattr(error.get("ctx", {}).get("error"), "fix", None)  # grammar.Refused says how
            out.append(
                f"{where}: {dotted(loc) or '(top level)'}: {message}" + (f"\n  fix: {fix}" if fix else "")
            )
    return out


def _data_path(loc: tuple[Any, ...], data: Any) -> Path_:
    """Drop pydantic's union/validator tags from an error location, keeping real keys."""
    out: list[str | int] = []
    node = data
    for part in loc:
        if isinstance(node, dict) and part in node:
            out.append(part)
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            out.append(part)
            node = node[part]
        elif isinstance(node, dict) and isinstance(part, str) and not _is_tag(part):
            out.append(part)  # a missing or unknown key
            node = None
    return tuple(out)


def _is_tag(part: str) -> bool:
    return "[" in part or part in ("int", "str", "float", "bool", "list", "dict")


def _model_at(loc: Path_) -> type[BaseModel]:
    model: type[BaseModel] = Topology
    pending_map = False
    for part in loc:
        if pending_map:
            pending_map = False
            continue
        annotation = model.model_fields[str(part)].annotation if str(part) in model.model_fields else None
        inner = _model_in(annotation)
        if inner is None:
            return model
        model, pending_map = inner
    return model


def _model_in(annotation: Any) -> tuple[type[BaseModel], bool] | None:
    """The model inside an annotation, and whether a mapping key comes before it."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is dict and args:
        found = _model_in(args[1])
        return (found[0], True) if found else None
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            found = _model_in(arg)
            if found:
                return found
    return None
