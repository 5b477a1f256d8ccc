"""`trtpipe bench` against real CPU Triton servers: the published tiny model and the no-work streaming model."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from trtpipe.bench import run_bench
from trtpipe.bench.metrics import Slo
from trtpipe.bench.report import BenchResult
from trtpipe.bench.workload import LengthDist, synthetic_workload
from trtpipe.cli import main

BENCH_MODELS = Path(__file__).resolve().parents[2] / "benchmarks" / "models"


@pytest.fixture(scope="module")
def example_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama built and published by the real pipeline (the serving area's helper)."""
    from trtpipe.serving.demo import publish_example

    return publish_example(tmp_path_factory.mktemp("bench-example"))


@pytest.fixture(scope="module")
def example_server(example_repo: Path):
    from trtpipe.serving.server import start_server

    with start_server(example_repo, start_timeout=120) as handle:
        yield handle


@pytest.mark.timeout(400)
def test_sweep_against_the_tiny_model(example_server, example_repo: Path, tmp_path: Path, trtpipe_home: Path) -> None:
    json_path = tmp_path / "bench.json"
    png_path = tmp_path / "bench.png"
    code = main([
        "bench", example_server.grpc_url, "--model", "ensemble", "--rates", "4,16", "--requests", "10",
        "--input-len", "uniform:4,24", "--output-len", "uniform:2,12", "--ignore-eos", "--seed", "3",
        "--duration", "60s", "--timeout", "30s", "--metrics-url", example_server.metrics_url,
        "--slo", "ttft=30s", "--json", str(json_path), "--plot", str(png_path), "--record", str(example_repo),
    ])
    assert code == 0
    result = BenchResult.model_validate_json(json_path.read_text())  # the JSON validates
    assert [run.rate for run in result.runs] == [4.0, 16.0]
    assert result.workload.token_counting == "tokenizer"  # the repository's tokenizer counted the prompts
    for run in result.runs:
        agg = run.aggregates
        assert agg.requests_sent == 10 and agg.requests_ok == 10 and agg.errors_by_kind == {}
        assert sorted(r.index for r in run.records) == list(range(10))
        for record in run.records:
            assert 0 < record.ttft_s <= record.e2e_s
            assert record.output_tokens == record.requested_output_tokens
        ensemble = run.server.for_model("ensemble")
        assert ensemble is not None and ensemble.request_success == 10  # the server counted what was sent
        assert ensemble.mean_request_s is not None and run.client_overhead_s is not None
        assert agg.goodput is not None and agg.requests_meeting_slo == 10
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    from trtpipe.results import ResultsLog
    from trtpipe.serving.identity import record_target

    # Filed under the repository digest the server reports serving, in the store that holds it.
    target = record_target(example_repo)
    assert target.digest == example_server.repository_digest
    recorded = ResultsLog(target.home).for_digest(target.digest)
    assert [(r.kind, r.passed, r.gpu_class) for r in recorded] == [("bench", True, "cpu-reference")]
    assert len(recorded[0].data["runs"]) == 2 and "records" not in recorded[0].data["runs"][0]


@pytest.mark.timeout(200)
def test_closed_loop_against_the_tiny_model(example_server) -> None:
    workload = synthetic_workload(8, LengthDist.parse("6"), LengthDist.parse("5"), seed=1)
    result = run_bench(
        example_server.grpc_url, workload, "closed", concurrency=3, duration_s=60, drain_s=30,
        metrics_url=example_server.metrics_url, sampling={"end_id": -1}, slo=Slo(),
    )
    (run,) = result.runs
    assert run.concurrency == 3 and run.aggregates.requests_ok == 8
    assert all(r.output_tokens == 5 for r in run.records)


@pytest.mark.timeout(120)
def test_server_killed_during_a_run_ends_in_time_and_reports_failures() -> None:
    from trtpipe.serving.server import start_server

    handle = start_server(BENCH_MODELS, validate=False, start_timeout=60)
    try:
        workload = synthetic_workload(10_000, LengthDist.parse("8"), LengthDist.parse("30"), seed=2)
        killer = threading.Timer(1.5, handle.kill)
        killer.start()
        started = time.monotonic()
        result = run_bench(
            handle.grpc_url, workload, "open", model="stream_tokens", rates=[40.0], duration_s=4.0, drain_s=3.0,
            metrics_url=handle.metrics_url,
        )
        elapsed = time.monotonic() - started
        killer.join()
    finally:
        handle.stop()
    (run,) = result.runs
    agg = run.aggregates
    assert elapsed < 4.0 + 3.0 + 8.0  # duration + drain, plus the slack of scraping a dead server
    assert agg.requests_sent < 10_000  # the time bound, not the request count, ended it
    assert agg.requests_ok > 0 and agg.requests_failed > 0
    assert agg.requests_ok + agg.requests_failed == agg.requests_sent
    assert sum(agg.errors_by_kind.values()) == agg.requests_failed
    assert run.server.error is not None  # the dead server's metrics could not be scraped: said, not hidden


@pytest.fixture(scope="module")
def stream_server():
    """The no-work streaming model of benchmarks/models (not a published repository: validation off)."""
    from trtpipe.serving.server import start_server

    with start_server(BENCH_MODELS, validate=False, start_timeout=60) as handle:
        yield handle


@pytest.mark.timeout(120)
def test_cli_closed_loop_on_a_sharegpt_dataset_json_to_stdout(stream_server, tmp_path: Path, capsys) -> None:
    dataset = tmp_path / "sharegpt.jsonl"
    rows = [{"conversations": [{"from": "human", "value": f"question {i} about kernels"},
                               {"from": "gpt", "value": "an answer"}]} for i in range(5)]
    dataset.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    code = main([
        "bench", stream_server.grpc_url, "--model", "stream_tokens", "--mode", "closed", "--concurrency", "4",
        "--requests", "24", "--dataset", str(dataset), "--output-len", "uniform:3,9", "--seed", "5",
        "--metrics-url", stream_server.metrics_url, "--json", "-",
    ])
    assert code == 0
    result = BenchResult.model_validate_json(capsys.readouterr().out)  # stdout is JSON only
    (run,) = result.runs
    assert run.concurrency == 4 and run.aggregates.requests_ok == 24
    assert {spec.prompt for spec in result.workload.requests} == {f"question {i} about kernels" for i in range(5)}
    assert all(r.output_tokens == r.requested_output_tokens for r in run.records)
    assert run.server.for_model("stream_tokens").request_success == 24


@pytest.mark.timeout(60)
def test_cli_against_no_server_fails_in_time_with_one_line(capsys) -> None:
    import socket

    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code = main(["bench", f"127.0.0.1:{port}", "--rate", "20", "--requests", "5", "--duration", "5s",
                 "--timeout", "2s", "--metrics-url", f"http://127.0.0.1:{port}/metrics"])
    assert code == 1
    out = capsys.readouterr().out
    assert "5 of 5 requests failed; first: unavailable" in " ".join(out.split())
