"""Promotion gates: what the recorded results of exactly one artifact digest must show.

Gates come from the spec's `release.gates.<channel>` (`ChannelGates`); a channel the spec does not
mention gets `ChannelGates()` (smoke required), so nothing is promoted that was never tested.
Smoke and parity read the latest recorded result of their kind for the digest (a later failure
overrides an earlier pass). Bench gates only count results recorded for the target's GPU class.

Bench gates judge repeated runs, never the last one. Every bench result recorded for the digest on
the target's GPU class is one run and counts, so benching again can add evidence but never choose
which run decides; a failed run (some request failed) counts as the worst figure there is. Fewer
than `min_runs` runs (the TRTPIPE_MIN_BENCH_RUNS setting, default 3) is `missing`, with how many
more to record. The noise model and the interval are `trtpipe.release.bench_stats`'s:

- an SLO (`bench.ttft_p99_ms: 5000`, `min_output_tokens_per_s`) is met when the MEDIAN of the runs'
  figures meets it. A run misses the limit with some probability p (the noise); the median of n runs
  misses it only when at least half of them do: P(Bin(n, p) >= n/2), e.g. 0.7 % for p = 5 % and n = 3,
  so a limit set with a margin is not flipped by one stalled run; a digest whose typical run sits at
  the limit is a coin toss by nature, whatever the rule.
- `max_regression_pct` compares the candidate's runs with the runs of the digest the channel holds,
  per figure: the log ratio delta is bounded by the Mann-Whitney / Hodges-Lehmann interval at 95 %
  each side (exact for any noise distribution under the shift model). Passed when the upper bound is
  within the tolerance t = log(1 + pct/100) (for throughput -log(1 - pct/100)); failed (regressed)
  when the lower bound is beyond it; otherwise `inconclusive`, refused with about how many more runs
  of each would decide. Each judgement wrongly fails a candidate within tolerance, or wrongly passes one
  beyond it, with probability at most 5 % (at the tolerance itself; far less away from it). Judged again
  after more runs, the chances add up at worst (two looks: 10 %), and only near the tolerance, where
  no rule can tell. Under the noise of a loaded 2-core host (docs/release.md: "Gates that noise cannot flip";
  `scripts/gate_noise_model.py`), following the gate's own advice on how many runs to add, a candidate
  equal to the incumbent ends passed in 99.9 % of cases and a 3x slower one ends refused in 99.3 %.

Bench `data` is read in the shape `trtpipe bench --record` stores (`runs[].aggregates`, seconds), or
flat (`ttft_p99_ms`, `tpot_p99_ms`, `e2e_p99_ms`, `output_tokens_per_s`, also under `summary`,
`aggregates` or `metrics`, or nested as `{"ttft_ms": {"p99": ...}}`).
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict

from trtpipe.release.bench_stats import ALPHA, PROJECTED_STEPS, Shift, median, runs_to_decide, shift
from trtpipe.results import ResultRecord
from trtpipe.release.gate_models import CPU_REFERENCE, ChannelGates

DEFAULT_MIN_RUNS = 3

LATENCY_METRICS = ("ttft_p99_ms", "tpot_p99_ms", "e2e_p99_ms")
THROUGHPUT_METRIC = "output_tokens_per_s"


class GateResult(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    gate: str  # smoke | parity | bench.<metric> | regression.<metric>
    status: str  # passed | failed | missing | inconclusive
    detail: str
    more_runs: int | None = None  # bench gates: about how many more runs (of each digest compared) would decide
    evidence: dict[str, Any] | None = None  # bench gates: every run's figure, the statistic and its interval

    @property
    def passed(self) -> bool:
        return self.status == "passed"


_RUN_STATS = {"ttft_p99_ms": "ttft_s", "tpot_p99_ms": "tpot_s", "e2e_p99_ms": "e2e_s"}


def _from_runs(runs: list[Any], name: str) -> float | None:
    """`trtpipe bench` summaries: `runs[].aggregates.{ttft_s,tpot_s,e2e_s}.p99` (seconds) and
    `output_token_throughput`. Across the load levels of a sweep, the worst P99 counts and the best
    throughput (the capacity reached); record one load level to gate on exactly that level."""
    values: list[float] = []
    for run in runs:
        agg = run.get("aggregates") if isinstance(run, dict) else None
        if not isinstance(agg, dict):
            continue
        if name in _RUN_STATS:
            stats = agg.get(_RUN_STATS[name])
            if isinstance(stats, dict) and isinstance(stats.get("p99"), (int, float)):
                values.append(float(stats["p99"]) * 1000.0)
        elif name == THROUGHPUT_METRIC and isinstance(agg.get("output_token_throughput"), (int, float)):
            values.append(float(agg["output_token_throughput"]))
    if not values:
        return None
    return max(values)


def bench_metric(data: dict[str, Any], name: str) -> float | None:
    """A bench figure by name, from the shapes bench results are recorded in."""
    if isinstance(data.get("runs"), list):
        found = _from_runs(data["runs"], name)
        if found is not None:
            return found
    places: list[dict[str, Any]] = [data]
    for sub in ("summary", "aggregates", "metrics"):
        if isinstance(data.get(sub), dict):
            places.append(data[sub])
    for place in places:
        value = place.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if name.endswith("_p99_ms"):
            base = name[: -len("_p99_ms")]
            for nested_name in (f"{base}_ms", base):
                nested = place.get(nested_name)
                if isinstance(nested, dict):
                    for key in ("p99", "p99_ms"):
                        if isinstance(nested.get(key), (int, float)):
                            return float(nested[key])
    if name == THROUGHPUT_METRIC:
        for place in places:
            for alias in ("output_token_throughput", "output_tokens_per_second", "output_throughput"):
                if isinstance(place.get(alias), (int, float)):
                    return float(place[alias])
    return None


def _same_class(record: ResultRecord, gpu_class: str | None) -> bool:
    # A result without a GPU class can only have come from a CPU run.
    return gpu_class is None or record.gpu_class == gpu_class or (record.gpu_class is None and gpu_class == CPU_REFERENCE)


def _latest(results: list[ResultRecord], kind: str, gpu_class: str | None = None) -> ResultRecord | None:
    matching = [r for r in results if r.kind == kind and _same_class(r, gpu_class)]
    return matching[-1] if matching else None


def _kind_gate(results: list[ResultRecord], kind: str) -> GateResult:
    latest = _latest(results, kind)
    if latest is None:
        return GateResult(gate=kind, status="missing", detail=f"no {kind} result recorded for this digest")
    if not latest.passed:
        return GateResult(gate=kind, status="failed", detail=f"latest {kind} result ({latest.recorded_at}) failed")
    return GateResult(gate=kind, status="passed", detail=f"{kind} passed at {latest.recorded_at}")


# --------------------------------------------------------------------------- bench runs


def bench_runs(results: list[ResultRecord], gpu_class: str | None) -> list[ResultRecord]:
    """Every bench result of the GPU class, oldest first: the runs a bench gate counts, all of them."""
    return [r for r in results if r.kind == "bench" and _same_class(r, gpu_class)]


def run_figure(run: ResultRecord, metric: str) -> float | None:
    """A run's figure for `metric`; a failed run's is the worst there is (inf ms, 0 tokens/s); None when a
    passed run does not carry the figure (it is not counted for it)."""
    if not run.passed:
        return 0.0 if metric == THROUGHPUT_METRIC else math.inf
    return bench_metric(run.data, metric)


def _worse_log(value: float, metric: str) -> float:
    """A figure on the log scale, oriented so that larger is worse."""
    if metric == THROUGHPUT_METRIC:
        return math.inf if value <= 0 else -math.log(value)
    return math.inf if value <= 0 or math.isinf(value) else math.log(value)


def _figures(runs: list[ResultRecord], metric: str) -> list[tuple[ResultRecord, float]]:
    out = []
    for run in runs:
        value = run_figure(run, metric)
        if value is not None:
            out.append((run, value))
    return out


def _fmt(value: float) -> str:
    if math.isinf(value):
        return "inf"
    return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"


def _run_list(figures: list[tuple[ResultRecord, float]]) -> list[dict[str, Any]]:
    return [{"recorded_at": r.recorded_at, "value": None if math.isinf(v) else v, "passed": r.passed}
            for r, v in figures]


def _too_few(gate: str, what: str, have: int, min_runs: int, target: str) -> GateResult:
    more = min_runs - have
    return GateResult(gate=gate, status="missing", more_runs=more,
                      detail=f"{have} bench run(s) of {what} on {target}, {min_runs} needed")


def _slo_gate(slo: str, limit: float, runs: list[ResultRecord], target: str, min_runs: int) -> GateResult:
    metric = THROUGHPUT_METRIC if slo == "min_output_tokens_per_s" else slo
    gate = f"bench.{slo}"
    figures = _figures(runs, metric)
    if not figures:
        if runs:
            return GateResult(gate=gate, status="missing", detail=f"no bench run on {target} carries {metric}")
        return GateResult(gate=gate, status="missing", more_runs=min_runs,
                          detail=f"no bench result recorded for this digest on {target}; {min_runs} runs needed")
    if len(figures) < min_runs:
        return _too_few(gate, "this digest", len(figures), min_runs, target)
    values = [v for _, v in figures]
    middle = median(values)
    failed = sum(1 for r, _ in figures if not r.passed)
    lower_is_better = slo != "min_output_tokens_per_s"
    ok = middle <= limit if lower_is_better else middle >= limit
    unit = " ms" if lower_is_better else ""
    sign = ("<=" if ok else ">") if lower_is_better else (">=" if ok else "<")
    note = f"; {failed} failed run(s) counted as the worst figure" if failed else ""
    return GateResult(
        gate=gate, status="passed" if ok else "failed",
        detail=f"{metric}: median of {len(values)} runs {_fmt(middle)}{unit} {sign} {limit:g}{unit} "
               f"(runs {', '.join(_fmt(v) for v in values)}{note})",
        evidence={"metric": metric, "limit": limit, "statistic": "median", "median": None if math.isinf(middle) else middle,
                  "runs": _run_list(figures)},
    )


def evaluate_gates(
    gates: ChannelGates,
    results: list[ResultRecord],
    *,
    target: str,
    current_results: list[ResultRecord] | None = None,
    current_digest: str | None = None,
    min_runs: int = DEFAULT_MIN_RUNS,
) -> list[GateResult]:
    """Every required gate with its status. `current_*` describe the artifact now in the channel;
    `min_runs`: the fewest bench runs a bench gate judges."""
    out: list[GateResult] = []
    if gates.smoke:
        out.append(_kind_gate(results, "smoke"))
    if gates.parity:
        out.append(_kind_gate(results, "parity"))
    runs = bench_runs(results, target)
    if gates.bench is not None:
        for slo, limit in gates.bench.model_dump(exclude_none=True).items():
            out.append(_slo_gate(slo, limit, runs, target, min_runs))
    if gates.max_regression_pct is not None:
        out.extend(_regression(gates.max_regression_pct, runs, current_results, current_digest, target, min_runs))
    return out


def tolerance_of(metric: str, max_pct: float) -> float:
    """The tolerance on the worse-oriented log scale: a latency may grow by `max_pct` %, a throughput fall by it."""
    if metric == THROUGHPUT_METRIC:
        return math.inf if max_pct >= 100 else -math.log(1 - max_pct / 100)
    return math.log(1 + max_pct / 100)


def _regression(
    max_pct: float, runs: list[ResultRecord], current_results: list[ResultRecord] | None, current_digest: str | None,
    target: str, min_runs: int,
) -> list[GateResult]:
    if current_digest is None:
        return [GateResult(gate="regression", status="passed", detail="channel is empty; nothing to regress against")]
    incumbent = bench_runs(current_results or [], target)
    if not runs:
        return [GateResult(gate="regression", status="missing", more_runs=min_runs,
                           detail=f"no bench run on {target} for this digest to compare ({min_runs} needed)")]
    if not incumbent:
        return [GateResult(gate="regression", status="missing", more_runs=min_runs,
                           detail=f"no bench run on {target} for the current {current_digest[:19]} ({min_runs} needed)")]
    out: list[GateResult] = []
    for metric in (*LATENCY_METRICS, THROUGHPUT_METRIC):
        ours, theirs = _figures(runs, metric), _figures(incumbent, metric)
        if not ours or not theirs:
            continue
        gate = f"regression.{metric}"
        if len(ours) < min_runs or len(theirs) < min_runs:
            short = [(what, len(f)) for what, f in (("this digest", ours), (f"the current {current_digest[:19]}", theirs))
                     if len(f) < min_runs]
            more = max(min_runs - n for _, n in short)
            out.append(GateResult(gate=gate, status="missing", more_runs=more,
                                  detail=f"{metric}: " + "; ".join(f"{n} bench run(s) of {what}" for what, n in short)
                                         + f" on {target}, {min_runs} of each needed"))
            continue
        out.append(_compare(gate, metric, max_pct, ours, theirs))
    if not out:
        out.append(GateResult(gate="regression", status="missing", detail="no metric is present in both digests' bench runs"))
    return out


def _compare(gate: str, metric: str, max_pct: float, ours: list[tuple[ResultRecord, float]],
             theirs: list[tuple[ResultRecord, float]]) -> GateResult:
    tolerance = tolerance_of(metric, max_pct)
    new_logs, old_logs = [_worse_log(v, metric) for _, v in ours], [_worse_log(v, metric) for _, v in theirs]
    found: Shift = shift(new_logs, old_logs)
    ours_median, theirs_median = median([v for _, v in ours]), median([v for _, v in theirs])
    evidence = {
        "metric": metric, "statistic": "Hodges-Lehmann ratio with Mann-Whitney bounds", "alpha_each_side": ALPHA,
        "candidate_runs": _run_list(ours), "incumbent_runs": _run_list(theirs),
        "candidate_median": _finite(ours_median), "incumbent_median": _finite(theirs_median),
        "worse_ratio": _finite(math.exp(found.estimate)), "worse_ratio_low": _finite(math.exp(found.low)),
        "worse_ratio_high": _finite(math.exp(found.high)), "tolerance_ratio": _finite(math.exp(tolerance)),
    }
    # The ratio is "how many times worse": new/old for a latency, old/new for a throughput.
    which = "new/old" if metric != THROUGHPUT_METRIC else "old/new"
    said = (f"{metric}: {found.m} runs vs {found.n} in channel, medians {_fmt(ours_median)} vs {_fmt(theirs_median)}; "
            f"ratio {which} {_fmt(math.exp(found.estimate))}, {1 - 2 * ALPHA:.0%} interval {_fmt(math.exp(found.low))}.."
            f"{_fmt(math.exp(found.high))}, " + (f"limit {_fmt(math.exp(tolerance))} ({max_pct:g}% worse)" if math.isfinite(tolerance)
                                                  else f"no limit ({max_pct:g}% worse allows any drop)"))
    if found.high <= tolerance:
        return GateResult(gate=gate, status="passed", evidence=evidence, detail=f"{said}: within it")
    if found.low > tolerance:
        return GateResult(gate=gate, status="failed", evidence=evidence, detail=f"{said}: regressed beyond it")
    more = runs_to_decide(new_logs, old_logs, tolerance)
    why = "so more runs must decide" if more is not None else "and sits on it: even 100 more runs of each may not decide"
    return GateResult(gate=gate, status="inconclusive", more_runs=more or PROJECTED_STEPS[-1], evidence=evidence,
                      detail=f"{said}: the interval straddles the limit, {why}")


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None
