"""Whether a benchmark run counts: every request served, the tokens asked for produced, and the client's
count matching the engines' own. Pure: the figures in, the reasons out (an empty list: valid)."""

from __future__ import annotations

from dataclasses import dataclass

MIN_OUTPUT_SHARE = 0.9  # output tokens per request at least 90% of --osl (ignore_eos is sent)
COUNT_TOLERANCE = 0.05  # client and server token totals within 5% (and 1 token per request)


@dataclass(frozen=True)
class PointFigures:
    concurrency: int
    requests_ok: int
    requests_failed: int
    output_tokens: float  # the client's total
    output_tokens_mean: float
    server_tokens: float | None  # the engines' generation counters over the point; None: not reported
    errors: tuple[str, ...] = ()
    timed_out: bool = False
    generator_failed: str | None = None  # aiperf exited non-zero or wrote no export


def judge_point(p: PointFigures, osl: int) -> list[str]:
    at = f"concurrency {p.concurrency}"
    if p.generator_failed:
        return [f"{at}: the load generator failed: {p.generator_failed}"]
    reasons = []
    if p.timed_out:
        reasons.append(f"{at}: did not finish within its time bound")
    if p.requests_failed:
        first = f" (first: {p.errors[0]})" if p.errors else ""
        reasons.append(f"{at}: {p.requests_failed} request(s) failed{first}")
    if p.requests_ok == 0:
        reasons.append(f"{at}: no request succeeded")
    elif p.output_tokens <= 0:
        reasons.append(f"{at}: 0 output tokens generated")
    elif p.output_tokens_mean < MIN_OUTPUT_SHARE * osl:
        reasons.append(
            f"{at}: {p.output_tokens_mean:.1f} output tokens per request, far below the {osl} asked "
            f"(at least {MIN_OUTPUT_SHARE:.0%} required)"
        )
    if p.server_tokens is not None and p.requests_ok:
        allowed = max(
            COUNT_TOLERANCE * max(p.server_tokens, p.output_tokens), p.requests_ok + p.requests_failed
        )
        if abs(p.server_tokens - p.output_tokens) > allowed:
            reasons.append(
                f"{at}: the client counted {p.output_tokens:.0f} output tokens, the engines' counters "
                f"{p.server_tokens:.0f} (tolerance {COUNT_TOLERANCE:.0%})"
            )
    return reasons
