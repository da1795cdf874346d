"""Shared by every test: the stand-in harness (tests/stand_ins, on pytest's pythonpath), and the
table of fault scenarios that `scripts/faults.sh` (pytest -m faults) prints at the end."""

from __future__ import annotations

import pytest

pytest.register_assert_rewrite("harness")

from harness import deployment  # noqa: E402,F401  the `deployment` fixture
from k8s_cluster import k8s_cluster  # noqa: E402,F401  the `k8s_cluster` fixture (one control plane per session)

# The long suites first, so that no worker starts one of them last while the others sit idle (measured with
# `--durations`: vLLM on the CPU, the Kubernetes control plane, SLURM, the engine parsers).
_LONG_FIRST = ("k8s", "vllm_cpu", "slurm", "engine_parsers", "bench")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`scripts/test.sh`: `--dist loadgroup`, a network namespace per worker), each test
    file is one group, run whole by one worker, so that a module's fixture (a SLURM cluster, vLLM on the CPU)
    starts once; every test of the session's Kubernetes control plane (`k8s_cluster`) is one group too, so
    that one worker owns that cluster. Before xdist's own hook, which reads the groups."""
    if not (config.getoption("loadgroup", False) or config.getoption("dist", "no") == "loadgroup"):
        return
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            group = "k8s" if "k8s_cluster" in getattr(item, "fixturenames", ()) else item.path.name
            item.add_marker(pytest.mark.xdist_group(group))

    def rank(item: pytest.Item) -> int:
        group = item.get_closest_marker("xdist_group").args[0]
        names = [m for m in _LONG_FIRST if item.get_closest_marker(m) or m == group]
        return _LONG_FIRST.index(names[0]) if names else len(_LONG_FIRST)

    items.sort(key=rank)  # stable: a file's tests keep their order


_FAULTS: list[tuple[str, bool, tuple[int, int] | None]] = []  # scenario, failed, (processes, ports) left


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """For each `@pytest.mark.faults("scenario")` test: its outcome over all phases, and what the `deployment`
    fixture found left alive at teardown."""
    report = (yield).get_result()
    marker = item.get_closest_marker("faults")
    if marker is None:
        return
    item.stash.setdefault(_FAILED, []).append(report.failed)
    if report.when == "teardown":
        left = dict(item.user_properties).get("left")
        _FAULTS.append((marker.args[0] if marker.args else item.name, any(item.stash[_FAILED]), left))


_FAILED = pytest.StashKey[list]()


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """One row per scenario (its parametrized cases together), in issue 9's order."""
    if not _FAULTS:
        return
    rows: dict[str, list] = {}
    for scenario, failed, left in _FAULTS:
        row = rows.setdefault(scenario, [0, 0, None])
        row[0] += 1
        row[1] += failed
        if left is not None:
            row[2] = tuple(a + b for a, b in zip(row[2] or (0, 0), left, strict=True))
    number = lambda s: (int(s.split(".")[0]) if s.split(".")[0].isdigit() else 99, s)  # noqa: E731
    width = max(map(len, rows))
    terminalreporter.section("fault scenarios")
    terminalreporter.write_line(f"{'scenario'.ljust(width)}  {'cases':>5}  {'outcome':<9}  left alive")
    for scenario in sorted(rows, key=number):
        cases, failed, left = rows[scenario]
        outcome = f"{failed} FAILED" if failed else "ok"
        left_text = f"{left[0]} processes, {left[1]} ports" if left else "- (no deployment fixture)"
        terminalreporter.write_line(f"{scenario.ljust(width)}  {cases:>5}  {outcome:<9}  {left_text}")
