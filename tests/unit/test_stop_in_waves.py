"""The one wave-stop: each wave's stops begin together, the next wave only once every one has reported."""

from __future__ import annotations

from dataclasses import dataclass

from muse_launch.proc.process import StopReport, stop_in_waves


@dataclass
class FakeStop:
    role: str
    done_at: float
    log: list[str]
    killed: tuple[str, ...] = ()

    def poll(self, now: float, kill_now: bool) -> StopReport | None:
        if now < self.done_at and not kill_now:
            return None
        self.log.append(f"{now:g} {self.role} gone")
        return StopReport(self.killed)


def test_waves_stop_in_order_and_the_reports_add_up():
    clock, log = [0.0], []
    durations = {"router": 1.0, "prefill": 2.0, "decode": 3.0, "encoder": 1.0}

    def begin(wave):
        log.append(f"{clock[0]:g} begin {','.join(wave)}")
        return [
            FakeStop(r, clock[0] + durations[r], log, (f"{r}: pid 1",) if r == "decode" else ()) for r in wave
        ]

    def wait():
        clock[0] += 1.0

    report = stop_in_waves([("router",), ("prefill", "decode"), ("encoder",)], begin, wait, lambda: clock[0])
    assert log == [
        "0 begin router",
        "1 router gone",
        "1 begin prefill,decode",
        "3 prefill gone",
        "4 decode gone",
        "4 begin encoder",
        "5 encoder gone",
    ]
    assert report == StopReport(("decode: pid 1",), ())


def test_kill_now_ends_every_wave_at_once():
    log: list[str] = []
    report = stop_in_waves(
        [("a",), ("b",)],
        lambda wave: [FakeStop(wave[0], 99.0, log)],
        lambda: None,
        lambda: 0.0,
        kill_now=lambda: True,
    )
    assert log == ["0 a gone", "0 b gone"] and report == StopReport()
