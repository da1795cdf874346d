"""Shared by every test: the stand-in harness (tests/stand_ins, on pytest's pythonpath), and the
table of fault scenarios that `scripts/faults.sh` (pytest -m faults) prints at the end."""

from __future__ import annotations

import pytest

pytest.register_assert_rewrite("harness")

from harness import deployment  # noqa: E402,F401  the `deployment` fixture
from k8s_cluster import k8s_cluster  # noqa: E402,F401  the `k8s_cluster` fixture (one control plane per session)

# How scripts/test.sh spreads the integration suites over pytest-xdist workers (`--dist loadfile`, each
# worker in a network namespace of its own): a test file runs whole on one worker, so that a module's fixture
# (a SLURM cluster, vLLM on the CPU) starts once; the files of the session's Kubernetes control plane
# (`k8s_cluster`) run on one worker, which owns that cluster; each document of test_docs.py is a unit of its
# own (they share nothing). Not xdist's `loadgroup`: under pytest 9 it no longer regroups the tests.
K8S_CLUSTER_FILES = ("test_k8s_up.py", "test_k8s_server.py", "test_k8s_live_changes.py")
ON_THEIR_OWN = ("test_docs.py",)


def unit_of_work(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    name = path.rsplit("/", 1)[-1]
    if name in K8S_CLUSTER_FILES:
        return "k8s control plane"
    return nodeid if name in ON_THEIR_OWN else path


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Units(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of_work(nodeid)

    return Units(config, log)


# The long units first (measured with `--durations`), so that no worker starts one of them last while the
# others sit idle; scripts/test.sh passes --no-loadscope-reorder so that xdist keeps this order.
_LONG_FIRST = ("k8s", "vllm_cpu", "slurm", "engine_parsers", "bench")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput"):  # an xdist worker: the order the scheduler takes the units in
        return

    def rank(item: pytest.Item) -> int:
        marked = [n for n, m in enumerate(_LONG_FIRST) if item.get_closest_marker(m)]
        return marked[0] if marked else len(_LONG_FIRST)

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
