"""Promotion gates: what the recorded results of exactly one artifact digest must show.

Gates come from the spec's `release.gates.<channel>` (`ChannelGates`); a channel the spec does not
mention gets `ChannelGates()` (smoke required), so nothing is promoted that was never tested.
Each gate reads the latest recorded result of its kind for the digest (a later failure overrides an
earlier pass). Bench gates only count results recorded for the target's GPU class.

Bench `data` is read in the shape `trtpipe bench --record` stores (`runs[].aggregates`, seconds), or
flat (`ttft_p99_ms`, `tpot_p99_ms`, `e2e_p99_ms`, `output_tokens_per_s`, also under `summary`,
`aggregates` or `metrics`, or nested as `{"ttft_ms": {"p99": ...}}`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from trtpipe.results import ResultRecord
from trtpipe.spec import CPU_REFERENCE, ChannelGates

LATENCY_METRICS = ("ttft_p99_ms", "tpot_p99_ms", "e2e_p99_ms")
THROUGHPUT_METRIC = "output_tokens_per_s"


class GateResult(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    gate: str  # smoke | parity | bench.<metric> | regression.<metric>
    status: str  # passed | failed | missing
    detail: str

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


def _latest(results: list[ResultRecord], kind: str, gpu_class: str | None = None) -> ResultRecord | None:
    def same_class(record: ResultRecord) -> bool:
        # A result without a GPU class can only have come from a CPU run.
        return gpu_class is None or record.gpu_class == gpu_class or (record.gpu_class is None and gpu_class == CPU_REFERENCE)

    matching = [r for r in results if r.kind == kind and same_class(r)]
    return matching[-1] if matching else None


def _kind_gate(results: list[ResultRecord], kind: str) -> GateResult:
    latest = _latest(results, kind)
    if latest is None:
        return GateResult(gate=kind, status="missing", detail=f"no {kind} result recorded for this digest")
    if not latest.passed:
        return GateResult(gate=kind, status="failed", detail=f"latest {kind} result ({latest.recorded_at}) failed")
    return GateResult(gate=kind, status="passed", detail=f"{kind} passed at {latest.recorded_at}")


def evaluate_gates(
    gates: ChannelGates,
    results: list[ResultRecord],
    *,
    target: str,
    current_results: list[ResultRecord] | None = None,
    current_digest: str | None = None,
) -> list[GateResult]:
    """Every required gate with its status. `current_*` describe the artifact now in the channel."""
    out: list[GateResult] = []
    if gates.smoke:
        out.append(_kind_gate(results, "smoke"))
    if gates.parity:
        out.append(_kind_gate(results, "parity"))
    bench_needed = gates.bench is not None or gates.max_regression_pct is not None
    bench = _latest(results, "bench", target) if bench_needed else None
    if gates.bench is not None:
        slos = gates.bench.model_dump(exclude_none=True)
        if bench is None:
            out.append(GateResult(gate="bench", status="missing", detail=f"no bench result recorded for this digest on {target}"))
        elif not bench.passed:
            out.append(GateResult(gate="bench", status="failed", detail=f"latest bench run on {target} ({bench.recorded_at}) failed"))
        else:
            for slo, limit in slos.items():
                metric = THROUGHPUT_METRIC if slo == "min_output_tokens_per_s" else slo
                value = bench_metric(bench.data, metric)
                if value is None:
                    out.append(GateResult(gate=f"bench.{slo}", status="missing", detail=f"bench result has no {metric}"))
                elif slo == "min_output_tokens_per_s":
                    ok = value >= limit
                    out.append(GateResult(gate=f"bench.{slo}", status="passed" if ok else "failed", detail=f"{metric} {value:g} {'>=' if ok else '<'} {limit:g}"))
                else:
                    ok = value <= limit
                    out.append(GateResult(gate=f"bench.{slo}", status="passed" if ok else "failed", detail=f"{metric} {value:g} ms {'<=' if ok else '>'} {limit:g} ms"))
    if gates.max_regression_pct is not None:
        out.extend(_regression(gates.max_regression_pct, bench, current_results, current_digest, target))
    return out


def _regression(
    max_pct: float, bench: ResultRecord | None, current_results: list[ResultRecord] | None, current_digest: str | None, target: str
) -> list[GateResult]:
    if current_digest is None:
        return [GateResult(gate="regression", status="passed", detail="channel is empty; nothing to regress against")]
    if bench is None or not bench.passed:
        return [GateResult(gate="regression", status="missing", detail=f"no passing bench result on {target} for this digest to compare")]
    current = _latest([r for r in current_results or [] if r.passed], "bench", target)
    if current is None:
        return [GateResult(gate="regression", status="missing", detail=f"no passing bench result on {target} for the current {current_digest[:19]}")]
    out: list[GateResult] = []
    for metric in (*LATENCY_METRICS, THROUGHPUT_METRIC):
        new, old = bench_metric(bench.data, metric), bench_metric(current.data, metric)
        if new is None or old is None or old <= 0:
            continue
        worse_pct = (new - old) / old * 100 if metric in LATENCY_METRICS else (old - new) / old * 100
        ok = worse_pct <= max_pct
        out.append(
            GateResult(
                gate=f"regression.{metric}",
                status="passed" if ok else "failed",
                detail=f"{metric} {new:g} vs {old:g} in channel: {abs(worse_pct):.1f}% {'worse' if worse_pct > 0 else 'better'} (limit {max_pct:g}% worse)",
            )
        )
    if not out:
        out.append(GateResult(gate="regression", status="missing", detail="no metric is present in both bench results"))
    return out
