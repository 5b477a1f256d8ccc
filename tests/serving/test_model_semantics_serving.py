"""Built, served and smoked with parity against transformers on the original model: what the model means survives to
the served model (issue 30). A sliding window shorter than the prompts, llama3 rope scaling past its original context,
and a vocabulary INT4-AWQ pads; each on the real tritonserver (cpu-reference)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from trtpipe.serving.client_patterns import unary_request
from trtpipe.settings import Settings

pytestmark = pytest.mark.timeout(900)

MAX_TOKENS = 24


def _spec(tmp: Path, name: str, model_dir: Path, extra: str = "", *, tp: int = 1) -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text(f"name: {name}\nmodel: {{path: {json.dumps(str(model_dir))}, dtype: float16}}\n"
                    f"target: {{gpu: cpu-reference, tp: {tp}}}\n"
                    "engine: {max_batch_size: 4, max_input_len: 256, max_seq_len: 512}\n"
                    f"triton: {{streaming: true}}\n{extra}")
    return path


def _build(spec: Path, store: Path) -> Path:
    from trtpipe.pipeline import run_build

    report = run_build(spec, store=store, progress=False, settings=Settings.from_env())
    assert report.repository_path, report.error or report.message
    return Path(report.repository_path)


def _smoke_with_parity(repo: Path, spec: Path, *, validate: bool = True):
    from trtpipe.checkpoint.afresh import converted_afresh
    from trtpipe.serving.server import start_server
    from trtpipe.serving.smoke import run_smoke

    with start_server(repo, start_timeout=180, validate=validate, settings=Settings.from_env()) as server, converted_afresh(spec) as reference:
        return run_smoke(server.grpc_url, parity_engine=reference, max_tokens=MAX_TOKENS, timeout=120)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("semantics-store")


@pytest.fixture(scope="module")
def window_repo(semantic_model, store: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    spec = _spec(tmp_path_factory.mktemp("spec"), "mistral-window", semantic_model("mistral-window"))
    return spec, _build(spec, store)


def test_a_32_token_window_is_served_and_matches_transformers_on_128_token_prompts(window_repo) -> None:
    spec, repo = window_repo
    config = (repo / "tensorrt_llm" / "config.pbtxt").read_text()
    assert 'key: "max_attention_window_size" value: { string_value: "32" }' in config
    result = _smoke_with_parity(repo, spec)
    assert result.passed, [c for c in result.checks if not c.passed]
    model = result.parity["model"]
    assert model["compared"] == "greedy token ids" and model["mismatches"] == 0
    assert model["longest_prompt"] == 128  # 4x the window, past it at every generated position
    assert result.parity["mismatches"] == 0


def test_a_served_model_without_its_window_fails_parity_against_the_model(window_repo, tmp_path: Path) -> None:
    """The check can fail: the same repository with the window parameter dropped to max_seq_len is refused by
    validate, and served anyway it differs from transformers past position 32 (and from the windowed reference)."""
    from trtpipe.serving.validate import validate_repository

    spec, repo = window_repo
    copy = tmp_path / "repo"
    shutil.copytree(repo, copy)
    for path in [copy, *copy.rglob("*")]:
        path.chmod(path.stat().st_mode | 0o200)
    config = copy / "tensorrt_llm" / "config.pbtxt"
    config.write_text(config.read_text().replace('string_value: "32" } }', 'string_value: "512" } }'))
    issues = [i.one_line() for i in validate_repository(copy) if i.severity == "error"]
    assert any("max_attention_window_size" in line for line in issues), issues
    result = _smoke_with_parity(copy, spec, validate=False)
    failed = {c.name for c in result.checks if not c.passed}
    assert "model-parity" in failed and "parity" in failed, result.checks


def test_llama3_rope_scaling_past_its_original_context_matches_transformers(semantic_model, store: Path,
                                                                            tmp_path: Path) -> None:
    spec = _spec(tmp_path, "llama3-rope", semantic_model("llama3-rope"))
    result = _smoke_with_parity(_build(spec, store), spec)
    assert result.passed, [c for c in result.checks if not c.passed]
    assert result.parity["model"]["longest_prompt"] > 64  # past original_max_position_embeddings


def test_an_awq_padded_vocabulary_is_banned_by_preprocessing(semantic_model, store: Path, tmp_path: Path) -> None:
    """INT4-AWQ at tp 2 pads 1001 ids to 1024: trtpipe.json records both, preprocessing bans 1001..1023 in every
    request (what keeps a TensorRT engine's sampler off them), and sampled answers hold no padded id."""
    from trtpipe.serving.client import TritonLLMClient
    from trtpipe.serving.server import start_server

    spec = _spec(tmp_path, "vocab-1001", semantic_model("vocab-1001"),
                 "quantization: {algo: int4_awq, group_size: 64, calibration: {samples: 8}}\n", tp=2)
    repo = _build(spec, store)
    engine = json.loads((repo / "trtpipe.json").read_text())["engine"]
    assert (engine["vocab_size"], engine["padded_vocab_size"]) == (1001, 1024)
    with start_server(repo, start_timeout=180, settings=Settings.from_env()) as server:
        pre = unary_request(server.grpc_url, "preprocessing", {
            "QUERY": np.array([[b"Once upon a time"]], dtype=object),
            "REQUEST_OUTPUT_LEN": np.array([[8]], dtype=np.int32),
            "BAD_WORDS_DICT": np.array([[b"the"]], dtype=object)}, outputs=None, timeout=60)
        words = pre.as_numpy("BAD_WORDS_IDS")[0]
        ends = [int(e) for e in words[1] if e >= 0]
        banned = [words[0][start:end].tolist() for start, end in zip([0, *ends[:-1]], ends)]
        assert [[i] for i in range(1001, 1024)] == banned[-23:] and len(banned) == 24  # "the" kept first
        client = TritonLLMClient(server.grpc_url, timeout=120)
        ids = [t for seed in range(8) for t in client.generate(
            "Once upon a time", 32, temperature=1.0, top_k=0, top_p=1.0, seed=seed).output_token_ids]
        assert ids and max(ids) <= 1000


def test_the_llm_api_track_gives_the_llm_the_window_and_serves_it(semantic_model, store: Path, tmp_path: Path) -> None:
    """backend llm-api: the window goes to the LLM's kv_cache_config.max_attention_window (per layer), and the served
    llmapi model answers as transformers does on 128-token prompts."""
    spec = _spec(tmp_path, "mistral-window-llmapi", semantic_model("mistral-window"), "backend: llm-api\n")
    repo = _build(spec, store)
    args = json.loads((repo / "tensorrt_llm" / "1" / "checkpoint" / "llm_args.json").read_text())
    assert args["kv_cache_config"]["max_attention_window"] == [32, 32]
    result = _smoke_with_parity(repo, spec)
    assert result.passed, [c for c in result.checks if not c.passed]
    assert result.parity["model"]["compared"] == "greedy text" and result.parity["model"]["longest_prompt"] == 128
