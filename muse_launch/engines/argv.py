"""Reading a rendered argv the way the engines' argparse-style parsers do."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def opt(flag: str, value: object | None) -> tuple[str, ...]:
    """`--flag value`, or nothing when value is None."""
    return () if value is None else (flag, str(value))


def matches(arg: str, flag: str) -> bool:
    return arg == flag or arg.startswith(flag + "=")


def has_flag(args: Sequence[str], flag: str) -> bool:
    return any(matches(a, flag) for a in args)


def last_index(args: Iterable[str], flags: Iterable[str] | str) -> int | None:
    """Where the last occurrence of any spelling of an option stands."""
    flags = (flags,) if isinstance(flags, str) else tuple(flags)
    found = None
    for i, arg in enumerate(args):
        if any(matches(arg, f) for f in flags):
            found = i
    return found


def last_value(args: Sequence[str], flag: str) -> str | None:
    """The value a parser would keep for `flag` (its last occurrence), `--flag=v` too."""
    found = None
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            found = args[i + 1]
        elif arg.startswith(flag + "="):
            found = arg.split("=", 1)[1]
    return found


def value(args: Sequence[str], *flags: str) -> str | None:
    """The value argparse keeps when an option has several spellings: the last occurrence of any."""
    args = tuple(args)
    at = last_index(args, flags)
    if at is None:
        return None
    arg = args[at]
    if "=" in arg and arg.split("=", 1)[0] in flags:
        return arg.split("=", 1)[1]
    return args[at + 1] if at + 1 < len(args) else None


def values_after(args: Sequence[str], flag: str) -> list[str]:
    """Every value of a repeatable option: `--encoder-urls A B --x` gives [A, B]."""
    out: list[str] = []
    for i, arg in enumerate(args):
        if arg == flag:
            for nxt in args[i + 1 :]:
                if nxt.startswith("-"):
                    break
                out.append(nxt)
    return out


def sizes(
    args: Sequence[str], key_flags: dict[str, tuple[str, ...]], keys: Iterable[str]
) -> dict[str, int] | None:
    """Each key's size as the argv sets it (1 where absent); None when one is not a positive whole number."""
    out: dict[str, int] = {}
    for key in keys:
        raw = value(args, *key_flags[key])
        size = 1 if raw is None else as_int(raw)
        if size is None or size < 1:
            return None
        out[key] = size
    return out


def as_int(text: object) -> int | None:
    try:
        return int(str(text))
    except ValueError:
        return None


def as_float(text: object) -> float | None:
    try:
        return float(str(text))
    except ValueError:
        return None
