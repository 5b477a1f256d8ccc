"""Per-request metrics and aggregates, on hand-computed examples (genai-perf definitions)."""

from __future__ import annotations

import pytest

from trtpipe.bench.metrics import Slo, Stats, aggregate, record_from_chunks
from trtpipe.errors import UsageError


def _record(index: int, t_sent: float, chunks: list[tuple[float, int]], *, final: bool = True, want: int | None = None,
            error: str | None = None):
    return record_from_chunks(
        index=index, t_scheduled=t_sent, t_sent=t_sent, t_end=chunks[-1][0] if chunks else t_sent + 0.01,
        input_tokens=10, requested_output_tokens=want if want is not None else sum(n for _, n in chunks),
        chunks=chunks, final_seen=final, error_kind=error,
    )


def test_ttft_itl_tpot_e2e() -> None:
    # An empty first response is ignored for TTFT (genai-perf); the last response carries 2 tokens.
    rec = _record(0, 1.0, [(1.05, 0), (1.1, 1), (1.3, 1), (1.7, 2)])
    assert rec.ok
    assert rec.ttft_s == pytest.approx(0.1)
    assert rec.e2e_s == pytest.approx(0.7)
    assert rec.output_tokens == 4 and rec.responses == 4
    assert rec.itl_s == pytest.approx([0.2, 0.2])  # 0.4 s for a response of 2 tokens -> 0.2 per token
    assert rec.tpot_s == pytest.approx((0.7 - 0.1) / 3)


def test_failures_and_empty_output() -> None:
    assert _record(0, 0.0, [(0.1, 1)], final=False).error_kind == "incomplete"
    failed = _record(1, 0.0, [(0.1, 1)], final=True, error="unavailable")
    assert not failed.ok and failed.error_kind == "unavailable" and failed.e2e_s is None
    empty = _record(2, 0.0, [(0.1, 0)])
    assert not empty.ok and empty.error_kind == "empty_output"


def test_aggregates_and_goodput() -> None:
    records = [
        _record(0, 0.0, [(0.1, 1), (0.2, 1)]),  # ttft 0.1, tpot 0.1
        _record(1, 0.5, [(0.9, 1), (1.0, 1)]),  # ttft 0.4, tpot 0.1
        _record(2, 1.0, [(1.1, 1), (2.0, 1)]),  # ttft 0.1, tpot 0.9
        _record(3, 1.5, [(1.6, 1)], final=False),  # failed
    ]
    agg = aggregate(records, Slo.parse("ttft=200ms,tpot=500ms"))
    assert agg.requests_sent == 4 and agg.requests_ok == 3 and agg.requests_failed == 1
    assert agg.errors_by_kind == {"incomplete": 1}
    assert agg.duration_s == pytest.approx(2.0)
    assert agg.request_throughput == pytest.approx(1.5)
    assert agg.output_token_throughput == pytest.approx(3.0)
    assert agg.requests_meeting_slo == 1 and agg.goodput == pytest.approx(0.5)
    assert agg.ttft_s.count == 3 and agg.ttft_s.p50 == pytest.approx(0.1)
    assert agg.output_tokens_match_requested
    assert aggregate(records).goodput is None


def test_stats_percentiles_interpolate_like_numpy() -> None:
    stats = Stats.of([1.0, 2.0, 3.0, 4.0])
    assert stats.p50 == pytest.approx(2.5) and stats.p90 == pytest.approx(3.7) and stats.mean == pytest.approx(2.5)
    assert Stats.of([]).count == 0 and Stats.of([]).mean is None


def test_slo_parsing() -> None:
    slo = Slo.parse("ttft=500ms,tpot=50ms,e2e=2s,itl=800us")
    assert (slo.ttft, slo.tpot, slo.e2e, slo.itl) == pytest.approx((0.5, 0.05, 2.0, 0.0008))
    assert not Slo.parse(None).is_set()
    for bad in ("ttft", "latency=5ms", "ttft=fast"):
        with pytest.raises(UsageError):
            Slo.parse(bad)
