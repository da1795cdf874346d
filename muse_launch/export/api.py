"""The export pipeline: plan, render, validate, write."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from .manifests import Manifest, SafeLoader, render
from .names import FLAVOURS
from .transform import SECRET_MARK_RE, ExportError, ExportPlan, export_plan
from .validate import Problem, check_dir_problems, check_documents


@dataclass(frozen=True)
class Exported:
    export: ExportPlan
    files: tuple[Manifest, ...]
    problems: tuple[Problem, ...]  # empty: written


def build(
    path: str | Path,
    flavour: str = "lws",
    namespace: str = "default",
    images: Mapping[str, str] = {},
    sets: Iterable[str] = (),
    rehearse: str | None = None,
) -> Exported:
    """Plan, render and validate, writing nothing. `rehearse`: see export_plan."""
    plan = export_plan(path, FLAVOURS[flavour], namespace, sets, rehearse)
    files = tuple(render(plan, images))
    for f in files:  # a secret is a secretKeyRef or $(NAME) read from one; an internal mark is never written
        if (left := SECRET_MARK_RE.search(f.text())) is not None:
            name = left.group(1)
            raise ExportError(
                f"{plan.loaded.source}: ${{env:{name}}} lands in {f.path} where Kubernetes "
                "cannot read it from a Secret",
                fix=f"use ${{env:{name}}} only in args, command or env values, or write the "
                "value in the file",
            )
    docs = [
        (f.path, doc) for f in files for doc in yaml.load_all(f.text(), Loader=SafeLoader) if doc is not None
    ]
    problems = check_documents(docs, [f.path for f in files])
    return Exported(plan, files, tuple(problems))


def export(
    path: str | Path,
    out: Path,
    flavour: str = "lws",
    namespace: str = "default",
    images: Mapping[str, str] = {},
    sets: Iterable[str] = (),
    rehearse: str | None = None,
) -> Exported:
    """Write the manifests into `out`, unless one fails validation (then nothing is written)."""
    done = build(path, flavour, namespace, images, sets, rehearse)
    if done.problems:
        return done
    if out.exists() and not out.is_dir() or out.is_symlink() and not out.exists():
        what = "a link to nothing" if out.is_symlink() and not out.exists() else "a file"
        raise ExportError(
            f"{out}: is {what}, not a directory (-o names the directory the manifests go into)",
            fix="give -o a new or an empty directory",
        )
    out.mkdir(parents=True, exist_ok=True)
    stale = sorted(p.name for p in out.iterdir() if p.suffix in (".yaml", ".yml")) if out.is_dir() else []
    ours = {f.path for f in done.files}
    if [s for s in stale if s not in ours]:
        raise ExportError(
            f"{out}: holds other manifests ({', '.join(s for s in stale if s not in ours)}); "
            f"export into an empty directory or remove them"
        )
    for f in done.files:
        (out / f.path).write_text(f.text())
    return done


def check_dir(directory: Path) -> list[Problem]:
    return check_dir_problems(directory)[0]
