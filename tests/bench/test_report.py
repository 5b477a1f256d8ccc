"""run_bench with an in-process sender: the JSON schema round-trips and the PNG is drawn."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Iterator

import pytest

from trtpipe.bench import run_bench
from trtpipe.bench.loadgen import TokenChunk
from trtpipe.bench.metrics import Slo
from trtpipe.bench.plot import plot_result
from trtpipe.bench.report import BenchResult, load_json, result_table, write_json
from trtpipe.commands.output import print_table
from trtpipe.bench.workload import LengthDist, RequestSpec, WordCounter, synthetic_workload


def quick_sender(request: RequestSpec, deadline: float) -> Iterator[TokenChunk]:
    time.sleep(0.003 + 0.0005 * request.input_tokens)  # "prefill"
    for i in range(request.max_tokens):
        time.sleep(0.001)
        yield TokenChunk(time.monotonic(), 1, i == request.max_tokens - 1)


@pytest.mark.timeout(60)
def test_sweep_json_table_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    workload = synthetic_workload(
        25, LengthDist.parse("uniform:4,20"), LengthDist.parse("uniform:2,8"), seed=1, counter=WordCounter()
    )
    result = run_bench(
        "in-process", workload, "open", model="fake", rates=[40.0, 160.0], duration_s=20, drain_s=5,
        slo=Slo.parse("ttft=1s"), sender=quick_sender,
    )
    assert [run.rate for run in result.runs] == [40.0, 160.0]
    assert all(run.aggregates.requests_sent == 25 and run.aggregates.requests_ok == 25 for run in result.runs)
    assert result.passed
    assert all(run.server.error for run in result.runs)  # no metrics URL: said, not hidden

    out = tmp_path / "result.json"
    write_json(result, out)
    again = load_json(out)
    assert again == result
    assert out.stat().st_mode & 0o777 == 0o644  # readable by others, unlike mkstemp's 0600
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]  # no temp file left
    assert isinstance(BenchResult.model_json_schema(), dict)

    table = result_table(result)
    print_table(table.title, table.columns, table.rows, caption=table.caption)
    text = capsys.readouterr().out
    assert "40 req/s" in text and "160 req/s" in text and "25/25" in text
    # One line per load level, every cell whole (rich stacked "mean / P50 / P90 / P99" four lines high at 80
    # columns): each of the 4 latency series on one line, on the row or under it as "E2E: …".
    lines = text.splitlines()
    rows = [line for line in lines if line.lstrip().startswith(("40 req/s", "160 req/s"))]
    assert len(rows) == 2 and all("25/25" in row for row in rows)
    series = [line for line in lines if " / " in line and not line.startswith("latencies")]
    assert sum(line.count(" / ") for line in series) == 2 * 4 * 3
    assert all(line.count(" / ") % 3 == 0 for line in series)
    assert "in words" in text and "counted in WORDS, not tokens (--token-counting words)" in " ".join(text.split())

    png = plot_result(result, tmp_path / "plots" / "bench.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [p for p in png.parent.iterdir() if p.name.startswith(".")]  # no temp file left


@pytest.mark.timeout(60)
def test_a_recorded_summary_redraws_the_same_figure(tmp_path: Path) -> None:
    """What `bench --record` keeps (the summary, through JSON) gives the plot the same input as the live result:
    the same labels and aggregates, and each successful request's TTFT to the microsecond."""
    import json

    from trtpipe.bench.plot import plot_input, plot_input_from_summary, png_bytes

    workload = synthetic_workload(12, LengthDist.parse("uniform:4,20"), LengthDist.parse("3"), seed=2, counter=WordCounter())
    result = run_bench("in-process", workload, "open", model="fake", rates=[50.0, 100.0], duration_s=20, drain_s=5,
                       sender=quick_sender)
    live = plot_input(result)
    recorded = plot_input_from_summary(json.loads(json.dumps(result.summary())))
    assert recorded is not None and recorded.title == live.title
    assert [(r.label, r.aggregates) for r in recorded.runs] == [(r.label, r.aggregates) for r in live.runs]
    for mine, theirs in zip(recorded.runs, live.runs, strict=True):
        assert len(mine.ttft_s) == len(theirs.ttft_s) == 12
        assert max(abs(a - b) for a, b in zip(mine.ttft_s, theirs.ttft_s, strict=True)) <= 5e-7  # rounded to 1 us
    assert png_bytes(recorded)[:8] == b"\x89PNG\r\n\x1a\n"
    # A result recorded by hand with flat figures has no curve to draw.
    assert plot_input_from_summary({"ttft_p99_ms": 12.0}) is None
    assert plot_input_from_summary({"runs": [{"aggregates": {"ttft_s": 1}}]}) is None
