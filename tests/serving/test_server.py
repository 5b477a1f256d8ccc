"""A real tritonserver on loopback serving the tiny example: ensemble and BLS, streaming and not,
parity with the reference runtime and with transformers, concurrency, stop words, limits, smoke."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from trtpipe.serving.client import TritonConnectionError, TritonLLMClient, TritonRequestError
from trtpipe.settings import Settings

pytestmark = pytest.mark.timeout(300)

MODELS = ("ensemble", "tensorrt_llm_bls")
PROMPTS = ["Once upon a time", "The cat sat on the", "In the beginning there was"]
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def greedy(triton_server) -> dict[str, list[int]]:
    """Greedy ensemble outputs (token ids) per prompt, the baseline other tests compare with."""
    client = TritonLLMClient(triton_server.grpc_url, timeout=60)
    return {p: client.generate(p, MAX_TOKENS, top_k=1).output_token_ids for p in PROMPTS}


def test_every_model_ready(triton_server) -> None:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(triton_server.grpc_url)
    try:
        assert client.is_server_live() and client.is_server_ready()
        for model in ("ensemble", "preprocessing", "tensorrt_llm", "postprocessing", "tensorrt_llm_bls"):
            assert client.is_model_ready(model), model
    finally:
        client.close()


@pytest.mark.parametrize("model", MODELS)
def test_generate_and_stream_agree(triton_server, model: str) -> None:
    client = TritonLLMClient(triton_server.grpc_url, model=model, timeout=60)
    generation = client.generate(PROMPTS[0], MAX_TOKENS, top_k=1)
    assert 0 < len(generation.output_token_ids) <= MAX_TOKENS
    assert generation.text.strip()
    chunks = list(client.stream(PROMPTS[0], MAX_TOKENS, top_k=1))
    assert chunks[-1].is_final and not any(c.is_final for c in chunks[:-1])
    assert [t for c in chunks for t in c.token_ids] == generation.output_token_ids
    assert "".join(c.text for c in chunks) == generation.text
    # Tokens arrive one response at a time, in order.
    times = [c.t_received for c in chunks]
    assert times == sorted(times) and sum(1 for c in chunks if c.token_ids) == len(generation.output_token_ids)


def test_parity_with_reference_runtime(triton_server, example_repo: Path) -> None:
    from trtpipe.reference.parity import ParityReference
    from trtpipe.serving.smoke import reference_greedy

    expected = reference_greedy(ParityReference(engine_dir=example_repo / "tensorrt_llm" / "1",
                                                tokenizer_dir=example_repo / "preprocessing" / "tokenizer"),
                                PROMPTS, MAX_TOKENS)
    for model in MODELS:
        client = TritonLLMClient(triton_server.grpc_url, model=model, timeout=60)
        got = [client.generate(p, MAX_TOKENS, top_k=1).output_token_ids for p in PROMPTS]
        assert got == expected, model


def test_parity_with_transformers(greedy: dict[str, list[int]], tiny_llama_dir: Path, example_repo: Path) -> None:
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    from trtpipe.serving.smoke import end_id_of

    tokenizer_dir = example_repo / "preprocessing" / "tokenizer"
    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    end_id = end_id_of(tokenizer_dir)
    # The engine holds float16 weights (spec dtype) computed in float32 by the reference runtime.
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, torch_dtype=torch.float16).float().eval()
    for prompt, triton_ids in greedy.items():
        ids = tokenizer.encode(prompt, add_special_tokens=True).ids
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False,
                                 eos_token_id=end_id, pad_token_id=end_id)
        hf_ids = out[0, len(ids):].tolist()
        if hf_ids and hf_ids[-1] == end_id:
            hf_ids = hf_ids[:-1]  # TRT-LLM does not return the end token
        assert triton_ids == hf_ids, prompt


def test_concurrent_streams(triton_server, greedy: dict[str, list[int]]) -> None:
    results: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def run(index: int, prompt: str, model: str) -> None:
        try:
            client = TritonLLMClient(triton_server.grpc_url, model=model, timeout=120)
            results[index] = [t for c in client.stream(prompt, MAX_TOKENS, top_k=1) for t in c.token_ids]
        except BaseException as err:  # reported below
            errors.append(err)

    jobs = [(i, PROMPTS[i % len(PROMPTS)], MODELS[i % 2]) for i in range(6)]
    threads = [threading.Thread(target=run, args=job) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=240)
    assert not errors, errors
    for index, prompt, _model in jobs:
        assert results[index] == greedy[prompt]


@pytest.mark.parametrize("model", MODELS)
def test_stop_words(triton_server, greedy: dict[str, list[int]], example_repo: Path, model: str) -> None:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(example_repo / "preprocessing" / "tokenizer" / "tokenizer.json"))
    full = greedy[PROMPTS[0]]
    # A stop word taken from the middle of the greedy output, as its own text.
    for position in range(2, len(full) - 1):
        word = tokenizer.decode([full[position]])
        word_ids = tokenizer.encode(word, add_special_tokens=False).ids
        if word.strip() and word_ids == [full[position]]:
            break
    else:
        pytest.fail(f"no usable stop word in {full}")
    first = full.index(full[position])
    client = TritonLLMClient(triton_server.grpc_url, model=model, timeout=60)
    stopped = client.generate(PROMPTS[0], MAX_TOKENS, top_k=1, stop_words=[word])
    assert stopped.output_token_ids == full[: first + 1]  # the stop sequence is included, as in TRT-LLM


@pytest.mark.parametrize("model", MODELS)
def test_max_tokens_honoured(triton_server, greedy: dict[str, list[int]], model: str) -> None:
    full = greedy[PROMPTS[1]]
    assert len(full) > 4, "the tiny model should not stop this early"
    client = TritonLLMClient(triton_server.grpc_url, model=model, timeout=60)
    assert client.generate(PROMPTS[1], 4, top_k=1).output_token_ids == full[:4]
    assert sum(len(c.token_ids) for c in client.stream(PROMPTS[1], 3, top_k=1)) == 3


@pytest.mark.parametrize("model", MODELS)
def test_prompt_longer_than_max_input_len_is_rejected(triton_server, example_repo: Path, model: str) -> None:
    max_input_len = json.loads((example_repo / "trtpipe.json").read_text())["engine"]["max_input_len"]
    client = TritonLLMClient(triton_server.grpc_url, model=model, timeout=60)
    with pytest.raises(TritonRequestError, match=rf"exceeds the engine's max_input_len {max_input_len}"):
        client.generate("word " * (2 * max_input_len), 4)
    # The server is still fine afterwards.
    assert client.generate(PROMPTS[0], 2, top_k=1).output_token_ids


def test_sampling_is_seeded(triton_server) -> None:
    client = TritonLLMClient(triton_server.grpc_url, timeout=60)
    first = client.generate(PROMPTS[2], MAX_TOKENS, temperature=1.0, top_k=50, top_p=0.95, seed=7)
    again = client.generate(PROMPTS[2], MAX_TOKENS, temperature=1.0, top_k=50, top_p=0.95, seed=7)
    assert first.output_token_ids == again.output_token_ids


def test_smoke_command_json_and_record(triton_server, example_repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from trtpipe.cli import main
    from trtpipe.results import ResultsLog
    from trtpipe.serving.identity import record_target
    from trtpipe.store.local import Store

    home = example_repo.parent.parent  # the workspace whose store holds the repository
    code = main(["smoke", triton_server.grpc_url, "--json", "--record", str(example_repo), "--store", str(home)])
    result = json.loads(capsys.readouterr().out)
    assert code == 0, result
    assert result["passed"] and {c["name"] for c in result["checks"]} >= {
        "live", "ready", "models_ready", "metadata", "generate", "stream"}
    target = record_target(example_repo, Store(home))
    # Recorded under what the server reports serving, which is exactly the repository's digest.
    assert result["served"]["repository_digest"] == target.digest == triton_server.repository_digest
    assert result["recorded_for"] == target.digest
    assert any(r.kind == "smoke" and r.passed for r in ResultsLog(home).for_digest(target.digest))


def test_served_models_report_the_repository_identity(triton_server, example_repo: Path) -> None:
    from trtpipe.serving.identity import read_served_identity

    served = read_served_identity(triton_server.grpc_url)
    manifest = json.loads((example_repo / "trtpipe.json").read_text())
    assert served.repository_digest == triton_server.repository_digest and served.repository_digest.startswith("sha256:")
    assert served.engine_digest == manifest["engine"]["digest"] and served.repository_key == example_repo.name
    assert sorted(served.models) == ["ensemble", "postprocessing", "preprocessing", "tensorrt_llm", "tensorrt_llm_bls"]
    # The server reads a serving directory outside the store entry, not the entry itself.
    assert triton_server.serving_dir is not None and example_repo not in triton_server.serving_dir.parents
    assert not list(example_repo.rglob("__pycache__"))


def test_smoke_parity_with_spec(triton_server, example_repo: Path, monkeypatch: pytest.MonkeyPatch,
                                tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from trtpipe.cli import main

    spec = example_repo.parent.parent.parent / "spec" / "tiny-llama-cpu.yaml"
    # Parity converts the spec's model afresh: it needs no store at all (an empty one here).
    monkeypatch.setenv("TRTPIPE_HOME", str(tmp_path / "empty-home"))
    code = main(["smoke", triton_server.grpc_url, "--model", "tensorrt_llm_bls", "--parity", str(spec), "--json"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0, result
    assert result["parity"]["mismatches"] == 0 and result["parity"]["prompts"] == 3
    assert not (tmp_path / "empty-home").exists() or not list((tmp_path / "empty-home").glob("*/*"))


def test_smoke_fails_against_no_server(capsys: pytest.CaptureFixture[str]) -> None:
    from trtpipe.cli import main
    from trtpipe.serving.server import free_ports

    (port,) = free_ports(1)
    assert main(["smoke", f"127.0.0.1:{port}", "--timeout", "3"]) == 1
    assert "FAIL live" in capsys.readouterr().out


@pytest.mark.timeout(600)
def test_server_killed_mid_stream(example_repo: Path) -> None:
    """A second server, killed while streaming: the client raises a clear error, nothing hangs.

    The client's gRPC thread queues responses as they arrive, so on a loaded machine the whole generation
    (120 tokens, the most the tiny engine's max_seq_len allows) can already be queued when the test reads its
    first chunk and kills the server: that stream ended before the kill and rightly raises nothing. Such an
    attempt proves nothing either way, so it is tried again on a fresh server, up to three times; one attempt
    must catch the server mid-generation and raise."""
    import os

    from trtpipe.serving.server import start_server

    outcomes = []
    for _attempt in range(3):
        with start_server(example_repo, start_timeout=180, settings=Settings.from_env()) as server:
            client = TritonLLMClient(server.grpc_url, timeout=15)
            received = []
            try:
                # end_id -1 never matches: the generation runs its full length.
                for chunk in client.stream(PROMPTS[0], 120, top_k=1, end_id=-1):
                    received.append(chunk)
                    if len(received) == 1:
                        server.kill()
            except TritonConnectionError as err:
                assert server.grpc_url in str(err)
                outcomes.append("raised")
            else:
                # No error: only acceptable when the server had already sent the whole generation.
                assert received[-1].is_final and sum(len(c.token_ids) for c in received) == 120
                outcomes.append("finished before the kill")
            assert received
            assert not server.alive()
        # Stopping reaps the dead server's orphaned Python stubs and their shared-memory regions.
        with pytest.raises(ProcessLookupError):
            os.killpg(server.pid, 0)
        assert not list(Path("/dev/shm").glob(f"{server.shm_prefix}*"))
        if outcomes[-1] == "raised":
            break
    assert outcomes[-1] == "raised", outcomes


@pytest.mark.timeout(240)
def test_non_streaming_deployment(example_repo: Path, tiny_llama_dir: Path, publish_example) -> None:
    """triton.streaming: false publishes a non-decoupled tensorrt_llm and BLS (upstream's BLS follows the deployment);
    unary calls work, streaming is refused."""
    from trtpipe.errors import TrtpipeError
    from trtpipe.serving.server import start_server

    example_dir = example_repo.parent.parent.parent  # publish_example's tmp_dir: same store, engine reused
    repo = publish_example(example_dir, streaming=False, model_dir=tiny_llama_dir)
    assert "decoupled: false" in (repo / "tensorrt_llm" / "config.pbtxt").read_text()
    with start_server(repo, start_timeout=180, settings=Settings.from_env()) as server:
        ensemble = TritonLLMClient(server.grpc_url, timeout=60)
        bls = TritonLLMClient(server.grpc_url, model="tensorrt_llm_bls", timeout=60)
        assert not ensemble.is_decoupled() and not bls.is_decoupled()
        assert ensemble.generate(PROMPTS[0], 8, top_k=1).output_token_ids == \
            bls.generate(PROMPTS[0], 8, top_k=1).output_token_ids
        with pytest.raises(TrtpipeError, match="not decoupled"):
            next(ensemble.stream(PROMPTS[0], 8))
        with pytest.raises(TrtpipeError, match="not decoupled"):
            next(bls.stream(PROMPTS[0], 8))
