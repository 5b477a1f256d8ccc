"""Per-request measurements and their aggregates, defined as genai-perf defines them.

Definitions (genai-perf, perf_analyzer `genai-perf` metrics documentation; vLLM's
benchmark_serving uses the same for TTFT, TPOT, ITL and E2E):

- **TTFT** (time to first token): from sending the request to receiving its first response
  that carries at least one token. Responses with no token are ignored, as genai-perf does.
- **E2E** (genai-perf "request latency"): from sending the request to receiving its final response.
- **ITL** (inter-token latencies): for each token-carrying response after the first, the time
  since the previous token-carrying response divided by the number of tokens in the later
  response (genai-perf's per-response definition). One request contributes several values.
- **TPOT** (time per output token, excluding the first): (E2E - TTFT) / (output tokens - 1),
  one value per request with at least two output tokens. genai-perf's current
  `inter_token_latency` statistic is this same per-request value.
- **Input / output sequence length**: tokens in the prompt (as the workload counted them) and
  tokens received.
- **Benchmark duration**: from the first request sent to the last response received.
- **Request throughput**: successful requests (final responses) / benchmark duration.
- **Output token throughput**: output tokens of successful requests / benchmark duration.
- **Goodput**: successful requests that meet every SLO / benchmark duration (genai-perf `--goodput`).
- Percentiles use linear interpolation between closest ranks (numpy's default), like genai-perf.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Iterable

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from trtpipe.errors import UsageError

SLO_METRICS = ("ttft", "tpot", "itl", "e2e")


class RequestRecord(BaseModel):
    """What happened to one request. Times are seconds; `t_sent` is relative to the run's start."""

    model_config = ConfigDict(extra="forbid")

    index: int
    t_scheduled: float = Field(description="when the load generator meant to send it (open loop: Poisson arrival)")
    t_sent: float
    elapsed_s: float = Field(description="send to final response, error or give-up, whichever ended the request")
    ok: bool
    error_kind: str | None = None
    error_message: str | None = None
    input_tokens: int
    requested_output_tokens: int
    output_tokens: int = 0
    responses: int = 0
    ttft_s: float | None = None
    e2e_s: float | None = None
    tpot_s: float | None = None
    itl_s: list[float] = Field(default_factory=list)


def record_from_chunks(
    *,
    index: int,
    t_scheduled: float,
    t_sent: float,
    input_tokens: int,
    requested_output_tokens: int,
    t_end: float,
    chunks: Iterable[tuple[float, int]],
    final_seen: bool,
    error_kind: str | None = None,
    error_message: str | None = None,
) -> RequestRecord:
    """Build a record from the (receive time, tokens in response) of every response, in order.

    `t_sent` and the receive times share one monotonic clock, relative to the run's start.
    A request is `ok` only when its final response arrived and no error was raised.
    """
    times: list[float] = []
    counts: list[int] = []
    last_t: float | None = None
    responses = 0
    for t_received, n_tokens in chunks:
        responses += 1
        last_t = t_received
        if n_tokens > 0:
            times.append(t_received)
            counts.append(n_tokens)
    output_tokens = sum(counts)
    ttft = times[0] - t_sent if times else None
    itl = [(times[i] - times[i - 1]) / counts[i] for i in range(1, len(times))]
    ok = final_seen and error_kind is None
    if ok and output_tokens == 0:
        ok, error_kind, error_message = False, "empty_output", "the final response arrived with no token at all"
    e2e = (last_t - t_sent) if (final_seen and last_t is not None) else None
    tpot = None
    if ok and e2e is not None and ttft is not None and output_tokens > 1:
        tpot = (e2e - ttft) / (output_tokens - 1)
    return RequestRecord(
        index=index,
        t_scheduled=t_scheduled,
        t_sent=t_sent,
        elapsed_s=max(0.0, t_end - t_sent),
        ok=ok,
        error_kind=None if ok else (error_kind or "incomplete"),
        error_message=None if ok else error_message,
        input_tokens=input_tokens,
        requested_output_tokens=requested_output_tokens,
        output_tokens=output_tokens,
        responses=responses,
        ttft_s=ttft,
        e2e_s=e2e if ok else None,
        tpot_s=tpot,
        itl_s=itl,
    )


class Stats(BaseModel):
    """Summary of one metric over a run (seconds for times, tokens for lengths)."""

    model_config = ConfigDict(extra="forbid")

    count: int
    mean: float | None = None
    min: float | None = None
    max: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None

    @classmethod
    def of(cls, values: Iterable[float]) -> "Stats":
        data = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
        if data.size == 0:
            return cls(count=0)
        p50, p90, p99 = np.percentile(data, [50, 90, 99])
        return cls(
            count=int(data.size),
            mean=float(data.mean()),
            min=float(data.min()),
            max=float(data.max()),
            p50=float(p50),
            p90=float(p90),
            p99=float(p99),
        )


class Slo(BaseModel):
    """Service-level objectives in seconds; a request is "good" when it meets every one that is set."""

    model_config = ConfigDict(extra="forbid")

    ttft: float | None = None
    tpot: float | None = None
    itl: float | None = None
    e2e: float | None = None

    @classmethod
    def parse(cls, text: str | None, *, option: str = "SLO") -> "Slo":
        """`"ttft=500ms,tpot=50ms"` (metrics: ttft, tpot, itl, e2e; units us, ms, s; bare = seconds)."""
        if not text:
            return cls()
        values: dict[str, float] = {}
        fix = f"write {option} like ttft=500ms,tpot=50ms (metrics: ttft, tpot, itl, e2e)"
        for part in text.split(","):
            name, sep, amount = part.partition("=")
            name = name.strip().lower()
            if not sep or name not in SLO_METRICS:
                raise UsageError(f"{option}: cannot read {part.strip()!r}", fix=fix)
            match = re.match(r"^\s*([0-9]*\.?[0-9]+)\s*(us|ms|s)?\s*$", amount)
            if not match:
                raise UsageError(f"{option}: {name}: cannot read {amount.strip()!r} as a duration", fix=fix)
            values[name] = float(match.group(1)) * {"us": 1e-6, "ms": 1e-3, "s": 1.0}[match.group(2) or "s"]
        return cls(**values)

    def is_set(self) -> bool:
        return any(getattr(self, name) is not None for name in SLO_METRICS)

    def met_by(self, record: RequestRecord) -> bool:
        """True when a successful request meets every SLO; ITL uses the request's worst gap."""
        if not record.ok:
            return False
        checks = (
            (self.ttft, record.ttft_s),
            (self.tpot, record.tpot_s),
            (self.e2e, record.e2e_s),
            (self.itl, max(record.itl_s) if record.itl_s else None),
        )
        return all(limit is None or (value is not None and value <= limit) for limit, value in checks)


class Aggregates(BaseModel):
    """Aggregates of one run (one rate or one concurrency)."""

    model_config = ConfigDict(extra="forbid")

    requests_sent: int
    requests_ok: int
    requests_failed: int
    errors_by_kind: dict[str, int]
    duration_s: float = Field(description="first request sent to last response received")
    request_throughput: float = Field(description="successful requests per second")
    output_token_throughput: float = Field(description="output tokens of successful requests per second")
    goodput: float | None = Field(default=None, description="requests per second meeting every SLO; None without SLOs")
    requests_meeting_slo: int | None = None
    ttft_s: Stats
    tpot_s: Stats
    itl_s: Stats
    e2e_s: Stats
    input_tokens: Stats
    output_tokens: Stats
    output_tokens_match_requested: bool = Field(description="every successful request returned exactly max_tokens tokens")
    schedule_lag_s: Stats = Field(
        description="t_sent - t_scheduled: how late the generator sent (open loop); large values mean it could not keep up"
    )


def aggregate(records: list[RequestRecord], slo: Slo | None = None) -> Aggregates:
    """Aggregate per-request records with the genai-perf definitions in this module's docstring."""
    ok = [r for r in records if r.ok]
    starts = [r.t_sent for r in records]
    ends = [r.t_sent + r.elapsed_s for r in records]
    duration = (max(ends) - min(starts)) if records else 0.0
    per_s = (lambda n: n / duration) if duration > 0 else (lambda n: 0.0)
    errors = Counter(r.error_kind or "unknown" for r in records if not r.ok)
    good = None
    meeting = None
    if slo is not None and slo.is_set():
        meeting = sum(1 for r in ok if slo.met_by(r))
        good = per_s(meeting)
    return Aggregates(
        requests_sent=len(records),
        requests_ok=len(ok),
        requests_failed=len(records) - len(ok),
        errors_by_kind=dict(sorted(errors.items())),
        duration_s=duration,
        request_throughput=per_s(len(ok)),
        output_token_throughput=per_s(sum(r.output_tokens for r in ok)),
        goodput=good,
        requests_meeting_slo=meeting,
        ttft_s=Stats.of(r.ttft_s for r in ok if r.ttft_s is not None),
        tpot_s=Stats.of(r.tpot_s for r in ok if r.tpot_s is not None),
        itl_s=Stats.of(v for r in ok for v in r.itl_s),
        e2e_s=Stats.of(r.e2e_s for r in ok if r.e2e_s is not None),
        input_tokens=Stats.of(float(r.input_tokens) for r in records),
        output_tokens=Stats.of(float(r.output_tokens) for r in ok),
        output_tokens_match_requested=all(r.output_tokens == r.requested_output_tokens for r in ok),
        schedule_lag_s=Stats.of(max(0.0, r.t_sent - r.t_scheduled) for r in records),
    )
