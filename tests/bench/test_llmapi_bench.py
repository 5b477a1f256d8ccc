"""`trtpipe bench` against an llmapi repository served by the real tritonserver (cpu-reference variant).

The llmapi model returns text only and streams the whole text so far; bench counts each response's new text in
tokens of the served tokenizer (the checkpoint's), so its output counts must equal the tokens of the text the
same request returns unary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtpipe.bench import run_bench
from trtpipe.bench.counting import text_token_counter
from trtpipe.bench.metrics import Slo
from trtpipe.bench.workload import HfTokenizerCounter, LengthDist, synthetic_workload
from trtpipe.cli import main
from trtpipe.errors import UsageError
from trtpipe.serving.client import TritonLLMClient
from trtpipe.serving.layouts import LAYOUTS, LLMAPI
from trtpipe.serving.llmapi_repository import served_tokenizer as llmapi_repository_tokenizer
from trtpipe.settings import Settings


@pytest.fixture(scope="module")
def llmapi_repo(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path, llmapi_artifact) -> Path:
    from trtpipe.resolve import resolve
    from trtpipe.serving.llmapi_repository import publish_llmapi_repository
    from trtpipe.spec_loader import load_spec

    tmp = tmp_path_factory.mktemp("llmapi-bench")
    spec = tmp / "spec.yaml"
    spec.write_text(f"name: tiny-llmapi\nmodel: {{path: {json.dumps(str(tiny_llama_dir))}, dtype: float16}}\n"
                    "target: {gpu: cpu-reference}\ntriton: {streaming: true}\n")
    return publish_llmapi_repository(resolve(load_spec(spec)), llmapi_artifact("llama", "fp8", "auto"),
                                     "sha256:" + "5" * 64, tmp / "repo")


@pytest.fixture(scope="module")
def server(llmapi_repo: Path):
    from trtpipe.serving.server import start_server

    with start_server(llmapi_repo, start_timeout=180, settings=Settings.from_env()) as handle:
        yield handle


@pytest.mark.timeout(400)
def test_closed_loop_counts_the_served_tokens(server, llmapi_repo: Path) -> None:
    tokenizer_json, add_special = llmapi_repository_tokenizer(llmapi_repo, "--tokenizer")
    assert tokenizer_json == llmapi_repo / "tensorrt_llm/1/checkpoint/tokenizer.json" and add_special is True
    counter = HfTokenizerCounter(tokenizer_json, add_special_tokens=True)
    workload = synthetic_workload(6, LengthDist.parse("uniform:4,12"), LengthDist.parse("8"), seed=4, counter=counter)
    count = text_token_counter(tokenizer_json)
    result = run_bench(server.grpc_url, workload, "closed", concurrency=2, duration_s=120, drain_s=60,
                       metrics_url=server.metrics_url, slo=Slo(), count_tokens=count)
    (run,) = result.runs
    assert result.model == "tensorrt_llm"  # the default model (ensemble) stands for the llmapi model
    assert result.output_token_counting == "text"
    assert run.aggregates.requests_ok == 6 and run.aggregates.errors_by_kind == {}
    client = TritonLLMClient(server.grpc_url, model="tensorrt_llm", timeout=120)
    for record in run.records:
        spec = workload.requests[record.index]
        expected = count(client.generate(spec.prompt, spec.max_tokens).text)  # greedy: no sampling input sent
        assert record.output_tokens == expected > 0
        assert 0 < record.ttft_s <= record.e2e_s
    served = run.server.for_model("tensorrt_llm")
    assert served is not None and served.request_success == 6  # Triton counted the requests under the real model


def test_an_llmapi_model_needs_a_token_counter(server) -> None:
    counter = HfTokenizerCounter(llmapi_repository_tokenizer(server.serving.source, "--tokenizer")[0])
    workload = synthetic_workload(1, LengthDist.parse("4"), LengthDist.parse("2"), seed=1, counter=counter)
    with pytest.raises(UsageError, match="returns text only"):
        run_bench(server.grpc_url, workload, "closed", concurrency=1, duration_s=30, drain_s=30)


@pytest.mark.timeout(400)
def test_cli_bench_with_the_llmapi_repository_as_tokenizer(server, llmapi_repo: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "bench.json"
    code = main(["bench", server.grpc_url, "--mode", "closed", "--concurrency", "2", "--requests", "4",
                 "--input-len", "6", "--output-len", "4", "--tokenizer", str(llmapi_repo),
                 "--metrics-url", server.metrics_url, "--output", str(out), "--json"])
    assert code == 0, capsys.readouterr().err
    summary = json.loads(capsys.readouterr().out)
    assert summary["model"] == "tensorrt_llm" and summary["output_token_counting"] == "text"
    data = json.loads(out.read_text())
    assert data["workload"]["tokenizer"] == str(llmapi_repo / "tensorrt_llm/1/checkpoint/tokenizer.json")
    assert data["workload"]["server_check_skipped"] == LAYOUTS[LLMAPI].uncounted
    assert all(r["output_tokens"] > 0 for r in data["runs"][0]["records"])


def test_cli_refuses_ignore_eos_against_an_llmapi_model(server, llmapi_repo: Path, capsys) -> None:
    code = main(["bench", server.grpc_url, "--mode", "closed", "--concurrency", "1", "--requests", "2",
                 "--tokenizer", str(llmapi_repo), "--ignore-eos"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(err) == 1 and "--ignore-eos" in err[0] and "no end_id input" in err[0]
