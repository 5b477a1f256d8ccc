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
from trtpipe.bench.counting import server_counts
from trtpipe.commands.bench import token_counter as counter_for
from trtpipe.bench.workload import LengthDist, WordCounter, synthetic_workload
from trtpipe.cli import main
from trtpipe.settings import Settings

BENCH_MODELS = Path(__file__).resolve().parents[2] / "benchmarks" / "models"


@pytest.fixture(scope="module")
def example_repo(tmp_path_factory: pytest.TempPathFactory, publish_example) -> Path:
    """The tiny Llama built and published by the real pipeline (tests/conftest.py's helper)."""
    return publish_example(tmp_path_factory.mktemp("bench-example"))


@pytest.fixture(scope="module")
def example_server(example_repo: Path):
    from trtpipe.serving.server import start_server

    with start_server(example_repo, start_timeout=120, settings=Settings.from_env()) as handle:
        yield handle


@pytest.mark.timeout(400)
def test_sweep_against_the_tiny_model(example_server, example_repo: Path, tmp_path: Path, trtpipe_home: Path) -> None:
    json_path = tmp_path / "bench.json"
    png_path = tmp_path / "bench.png"
    code = main([
        "bench", example_server.grpc_url, "--model", "ensemble", "--rates", "4,16", "--requests", "10",
        "--input-len", "uniform:4,24", "--output-len", "uniform:2,12", "--ignore-eos", "--seed", "3",
        "--duration", "60s", "--timeout", "30s", "--metrics-url", example_server.metrics_url,
        "--slo", "ttft=30s", "--output", str(json_path), "--plot", str(png_path), "--record", str(example_repo),
        "--store", str(example_repo.parent.parent),
    ])
    assert code == 0
    result = BenchResult.model_validate_json(json_path.read_text())  # the JSON validates
    assert [run.rate for run in result.runs] == [4.0, 16.0]
    workload = result.workload
    assert workload.token_counting == "tokenizer"  # the repository's tokenizer counted the prompts ...
    assert workload.tokenizer == str(example_repo / "preprocessing" / "tokenizer" / "tokenizer.json")
    assert workload.add_special_tokens is True  # ... with the BOS the served preprocessing model adds
    assert workload.server_check is not None and workload.server_check.prompts_checked == 10  # and the server agreed
    assert workload.server_check.max_input_len == 64 and workload.server_check.prompts_over_max_input_len == 0
    assert all(4 <= spec.input_tokens <= 24 for spec in workload.requests)
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
    from trtpipe.store.local import Store

    # Filed under the repository digest the server reports serving, in the workspace of the store that holds it.
    home = example_repo.parent.parent
    target = record_target(example_repo, Store(home))
    assert target.digest == example_server.repository_digest
    recorded = ResultsLog(home).for_digest(target.digest)
    assert [(r.kind, r.passed, r.gpu_class) for r in recorded] == [("bench", True, "cpu-reference")]
    assert len(recorded[0].data["runs"]) == 2 and "records" not in recorded[0].data["runs"][0]


@pytest.mark.timeout(200)
def test_closed_loop_against_the_tiny_model(example_server, example_repo: Path) -> None:
    counter, _, _ = counter_for("tokenizer", example_repo, None, example_server.grpc_url)
    workload = synthetic_workload(8, LengthDist.parse("6"), LengthDist.parse("5"), seed=1, counter=counter)
    result = run_bench(
        example_server.grpc_url, workload, "closed", concurrency=3, duration_s=60, drain_s=30,
        metrics_url=example_server.metrics_url, sampling={"end_id": -1}, slo=Slo(),
    )
    (run,) = result.runs
    assert run.concurrency == 3 and run.aggregates.requests_ok == 8
    assert all(r.output_tokens == 5 for r in run.records)


@pytest.mark.timeout(300)
def test_input_len_is_exact_in_served_tokens_at_the_engine_limit(example_server, example_repo: Path, tmp_path: Path, capsys) -> None:
    """Given only the URL and --tokenizer REPO: --input-len 64 (the engine's max_input_len) makes prompts that
    the served preprocessing model counts as exactly 64 tokens, BOS included, and the engine accepts every one;
    --input-len 65 is one token too long for every prompt, and the engine refuses every one."""
    limit = 64  # tests/conftest.py EXAMPLE_LIMITS["max_input_len"]
    common = ["bench", example_server.grpc_url, "--mode", "closed", "--concurrency", "2", "--requests", "6",
              "--output-len", "2", "--ignore-eos", "--tokenizer", str(example_repo), "--seed", "11",
              "--metrics-url", example_server.metrics_url]
    json_path = tmp_path / "at-limit.json"
    assert main([*common, "--input-len", str(limit), "--output", str(json_path)]) == 0
    result = BenchResult.model_validate_json(json_path.read_text())
    prompts = [spec.prompt for spec in result.workload.requests]
    assert [spec.input_tokens for spec in result.workload.requests] == [limit] * 6
    assert len(set(prompts)) == 6  # six different prompts, each exact
    # The server's own count, asked here independently of bench's check: the length the engine sees.
    assert server_counts(example_server.grpc_url, prompts, max_batch_size=4, model="preprocessing") == [limit] * 6
    assert result.workload.server_check is not None and result.workload.server_check.prompts_checked == 6
    (run,) = result.runs
    assert run.aggregates.requests_ok == 6 and run.aggregates.input_tokens.mean == limit
    assert "equal to the served preprocessing's count on 6 prompts" in " ".join(capsys.readouterr().out.split())

    over_path = tmp_path / "over-limit.json"
    assert main([*common, "--input-len", str(limit + 1), "--output", str(over_path)]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert f"6 of 6 prompts are longer than the served max_input_len {limit}" in out
    over = BenchResult.model_validate_json(over_path.read_text())
    assert [spec.input_tokens for spec in over.workload.requests] == [limit + 1] * 6
    (run,) = over.runs
    assert run.aggregates.requests_failed == 6
    assert all(f"input length {limit + 1} exceeds the engine's max_input_len {limit}" in r.error_message for r in run.records)


@pytest.mark.timeout(200)
def test_a_tokenizer_other_than_the_served_one_is_refused(example_server, bpe_tokenizer_dir: Path, capsys) -> None:
    code = main(["bench", example_server.grpc_url, "--rate", "5", "--requests", "4", "--input-len", "20",
                 "--tokenizer", str(bpe_tokenizer_dir), "--metrics-url", example_server.metrics_url])
    assert code == 2
    out = capsys.readouterr()
    message = " ".join((out.out + out.err).split())
    assert "that is not the tokenizer the server serves" in message and "--tokenizer" in message


@pytest.mark.timeout(60)
def test_bench_without_a_tokenizer_says_how_to_give_one(capsys) -> None:
    """No tokenizer and no --token-counting words: one line, exit 2, before any server is contacted."""
    code = main(["bench", "127.0.0.1:1", "--rate", "5", "--requests", "4"])
    assert code == 2
    out = capsys.readouterr()
    lines = [line for line in (out.out + out.err).splitlines() if line.strip()]
    assert len(lines) == 1 and "--tokenizer" in lines[0] and "--token-counting words" in lines[0]


@pytest.mark.timeout(120)
def test_server_killed_during_a_run_ends_in_time_and_reports_failures() -> None:
    from trtpipe.serving.server import start_server

    handle = start_server(BENCH_MODELS, validate=False, start_timeout=60, settings=Settings.from_env())
    try:
        workload = synthetic_workload(10_000, LengthDist.parse("8"), LengthDist.parse("30"), seed=2, counter=WordCounter())
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

    with start_server(BENCH_MODELS, validate=False, start_timeout=60, settings=Settings.from_env()) as handle:
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
        "--metrics-url", stream_server.metrics_url, "--json", "--output", str(tmp_path / "raw.json"),
        "--token-counting", "words",
    ])
    assert code == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)  # stdout is JSON only: the summary a results log keeps
    result = BenchResult.model_validate_json((tmp_path / "raw.json").read_text())  # --output: every request
    assert summary == json.loads(json.dumps(result.summary()))
    assert "records" not in summary["runs"][0] and summary["runs"][0]["concurrency"] == 4
    # Words were asked for (the no-work model has no tokenizer): the JSON and the table say so.
    assert result.workload.token_counting == "words" and result.workload.tokenizer is None
    assert "counted in WORDS, not tokens" in " ".join(captured.err.split())
    assert [spec.input_tokens for spec in result.workload.requests if spec.prompt == "question 1 about kernels"][0] == 4
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
                 "--timeout", "2s", "--metrics-url", f"http://127.0.0.1:{port}/metrics", "--token-counting", "words"])
    assert code == 1
    out = capsys.readouterr().out
    assert "5 of 5 requests failed; first: unavailable" in " ".join(out.split())


@pytest.mark.timeout(120)
def test_warmup_requests_are_sent_first_excluded_from_every_figure_and_reported_apart(
    stream_server, tmp_path: Path, capsys
) -> None:
    """Issue 15: the first measured request no longer carries the client's imports and stream set-up, and
    `--warmup N` requests (own prompts) go first, in no figure of the run, in the JSON and table apart."""
    code = main([
        "bench", stream_server.grpc_url, "--model", "stream_tokens", "--mode", "closed", "--concurrency", "2",
        "--requests", "6", "--warmup", "2", "--input-len", "uniform:3,8", "--output-len", "4", "--seed", "9",
        "--metrics-url", stream_server.metrics_url, "--json", "--output", str(tmp_path / "raw.json"),
        "--token-counting", "words",
    ])
    assert code == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    result = BenchResult.model_validate_json((tmp_path / "raw.json").read_text())
    (run,) = result.runs
    assert result.warmup is not None and len(result.warmup.records) == 2
    assert result.warmup.aggregates.requests_sent == 2 and result.warmup.aggregates.requests_ok == 2
    # The run's figures are the 6 requests asked for, numbered 0..5, none of them a warm-up.
    assert run.aggregates.requests_sent == 6 and sorted(r.index for r in run.records) == list(range(6))
    assert len(result.workload.requests) == 6
    warm_prompts = {r.index for r in result.warmup.records}
    assert warm_prompts == {0, 1}
    # The server counted the run's requests only: the warm-ups finished before its "before" scrape.
    assert run.server.for_model("stream_tokens").request_success == 6
    # Reported apart: the summary a results log keeps has them beside the runs (the gates read "runs").
    assert summary["warmup"]["aggregates"]["requests_sent"] == 2 and "records" not in summary["warmup"]
    assert [r["aggregates"]["requests_sent"] for r in summary["runs"]] == [6]
    table = " ".join(captured.err.split())
    (warm_row,) = [line for line in captured.err.splitlines() if line.startswith("warm-up")]
    assert "2/2" in warm_row and "(excluded)" in table and "warm-up: 2 request(s) sent one at a time" in table


def test_the_sender_imports_and_opens_its_streams_before_the_first_send(stream_server) -> None:
    """Structure, not timing: after the sender is made and its streams opened, sending a request imports
    nothing and opens no stream (what used to land in request 1's TTFT)."""
    import subprocess
    import sys

    script = f"""
import sys, time
from trtpipe.bench.loadgen import TritonSender
from trtpipe.bench.workload import RequestSpec
sender = TritonSender({stream_server.grpc_url!r}, "stream_tokens")
assert "tritonclient.grpc" in sys.modules and "trtpipe.serving.client" in sys.modules
sender.open_streams(2)
assert len(sender._idle) == 2
before = set(sys.modules)
chunks = list(sender(RequestSpec(index=0, prompt="a b c", input_tokens=3, max_tokens=3), time.monotonic() + 30))
assert chunks and chunks[-1].is_final, chunks
assert set(sys.modules) == before, sorted(set(sys.modules) - before)
assert len(sender._idle) == 2  # the stream it took went back to the pool: none was opened
sender.close()
print("ok")
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]
