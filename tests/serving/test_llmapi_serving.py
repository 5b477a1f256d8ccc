"""The llmapi repository served by the real tritonserver (cpu-reference variant), streaming and not.

What is checked against the reference runtime is a fresh export of the same model (the `export_llmapi` fixture),
never the files the server loads (issue 11's rule)."""

from __future__ import annotations

import json
import queue
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from safetensors.torch import load_file, save_file

from trtpipe.errors import UsageError
from trtpipe.serving.client import LLMAPI, REQUEST_CONTRACTS, TritonLLMClient, TritonRequestError, resolve_model
from trtpipe.serving.llmapi_repository import ARTIFACT_DIR, publish_llmapi_repository
from trtpipe.serving.smoke import run_smoke
from trtpipe.settings import Settings

PROMPT = "The cat sat on the"
MAX_TOKENS = 12
DIGEST = "sha256:" + "1" * 64


def _resolved(tmp_path: Path, model_dir: Path, streaming: bool):
    from trtpipe.resolve import resolve
    from trtpipe.spec_loader import load_spec

    spec = tmp_path / "spec.yaml"
    spec.write_text(f"name: tiny-llmapi\nmodel: {{path: {json.dumps(str(model_dir))}, dtype: float16}}\n"
                    f"target: {{gpu: cpu-reference}}\ntriton: {{streaming: {'true' if streaming else 'false'}}}\n")
    return resolve(load_spec(spec))


def _serve(repo: Path):
    from trtpipe.serving.server import start_server

    return start_server(repo, start_timeout=180, settings=Settings.from_env())


@pytest.fixture(scope="module")
def artifact(llmapi_artifact) -> Path:
    return llmapi_artifact("llama", "int4_awq", "fp8")


@pytest.fixture(scope="module")
def fresh_export(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path, export_llmapi) -> Path:
    """The same model exported again, for parity (deterministic export: the same bytes, other files)."""
    return export_llmapi(tiny_llama_dir, tmp_path_factory.mktemp("fresh") / "export", algo="int4_awq", kv_cache="fp8")


@pytest.fixture(scope="module")
def streaming_repo(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path, artifact: Path) -> Path:
    tmp = tmp_path_factory.mktemp("llmapi-streaming")
    return publish_llmapi_repository(_resolved(tmp, tiny_llama_dir, True), artifact, DIGEST, tmp / "repo")


@pytest.fixture(scope="module")
def server(streaming_repo: Path) -> Iterator:
    with _serve(streaming_repo) as handle:
        yield handle


@pytest.fixture(scope="module")
def unary_server(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path, artifact: Path) -> Iterator:
    tmp = tmp_path_factory.mktemp("llmapi-unary")
    repo = publish_llmapi_repository(_resolved(tmp, tiny_llama_dir, False), artifact, DIGEST, tmp / "repo")
    with _serve(repo) as handle:
        yield handle


def _raw(url: str, inputs: dict[str, np.ndarray], *, request_id: str | None = None) -> list:
    """Send one request on a stream; every response until the final flag (raises on an error response)."""
    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    dtypes = {np.dtype(object): "BYTES", np.dtype(bool): "BOOL", np.dtype(np.int32): "INT32",
              np.dtype(np.float32): "FP32", np.dtype(np.uint64): "UINT64"}
    tensors = []
    for name, value in inputs.items():
        tensor = grpcclient.InferInput(name, list(value.shape), dtypes[value.dtype])
        tensor.set_data_from_numpy(value)
        tensors.append(tensor)
    out = []
    try:
        client.async_stream_infer("tensorrt_llm", tensors, request_id=request_id or uuid.uuid4().hex,
                                  enable_empty_final_response=True)
        while True:
            result, error = responses.get(timeout=120)
            if error is not None:
                raise RuntimeError(str(error))
            out.append(result)
            if result.get_response().parameters["triton_final_response"].bool_param:
                return out
    finally:
        client.stop_stream()
        client.close()


def _text(result) -> str:
    array = result.as_numpy("text_output")
    return "" if array is None else array.reshape(-1)[0].decode()


def test_the_default_model_is_the_llmapi_model(server) -> None:
    assert resolve_model(server.grpc_url) == ("tensorrt_llm", REQUEST_CONTRACTS[LLMAPI])
    metadata = grpcclient.InferenceServerClient(server.grpc_url).get_model_metadata("tensorrt_llm", as_json=True)
    assert len(metadata["inputs"]) == 22 and len(metadata["outputs"]) == 16


def test_smoke_with_parity_passes(server, fresh_export: Path) -> None:
    result = run_smoke(server.grpc_url, parity_engine=(fresh_export, fresh_export), max_tokens=MAX_TOKENS, timeout=120)
    assert result.passed, [c for c in result.checks if not c.passed]
    assert result.model == "tensorrt_llm"
    assert {c.name for c in result.checks} == {"live", "ready", "models_ready", "metadata", "generate", "stream",
                                               "deployment", "unary", "stop", "parity", "model-parity"}
    assert result.parity["compared"] == "text" and result.parity["mismatches"] == 0
    assert all(row["triton"] for row in result.parity["rows"])
    assert result.served["engine_digest"] == DIGEST


def test_unary_deployment_passes_smoke_with_parity(unary_server, fresh_export: Path) -> None:
    result = run_smoke(unary_server.grpc_url, parity_engine=(fresh_export, fresh_export), max_tokens=MAX_TOKENS,
                       timeout=120)
    assert result.passed, [c for c in result.checks if not c.passed]
    stream = next(c for c in result.checks if c.name == "stream")
    assert stream.detail.startswith("skipped")


def test_streamed_deltas_add_up_to_the_unary_text(server, unary_server) -> None:
    streamed = list(TritonLLMClient(server.grpc_url, model="tensorrt_llm", timeout=120).stream(PROMPT, MAX_TOKENS, top_k=1))
    unary = TritonLLMClient(unary_server.grpc_url, model="tensorrt_llm", timeout=120).generate(PROMPT, MAX_TOKENS, top_k=1)
    assert len(streamed) > 2 and streamed[-1].is_final
    assert "".join(c.text for c in streamed) == unary.text != ""
    assert unary.output_token_ids == []  # the llmapi contract returns text only


def test_upstream_response_semantics(server, unary_server) -> None:
    """Without exclude_input_from_output a non-streaming answer echoes the prompt (upstream's default, false in
    helpers.py) and a streamed one never does (the executor streams generated tokens only); each streamed
    text_output is the whole generated text so far; finish_reason and cumulative_logprob come as strings."""
    unary = _raw(unary_server.grpc_url, {
        "text_input": np.array([PROMPT.encode()], dtype=object),
        "sampling_param_max_tokens": np.array([6], dtype=np.int32),
        "sampling_param_top_k": np.array([1], dtype=np.int32),
    })
    whole = [_text(r) for r in unary if r.as_numpy("text_output") is not None]
    assert len(whole) == 1 and whole[0].startswith(PROMPT) and len(whole[0]) > len(PROMPT)
    responses = _raw(server.grpc_url, {
        "text_input": np.array([PROMPT.encode()], dtype=object),
        "streaming": np.array([True]),
        "sampling_param_max_tokens": np.array([6], dtype=np.int32),
        "sampling_param_top_k": np.array([1], dtype=np.int32),
        "return_finish_reason": np.array([True]),
        "return_cumulative_logprob": np.array([True]),
    })
    texts = [_text(r) for r in responses if r.as_numpy("text_output") is not None]
    assert not any(t.startswith(PROMPT) for t in texts)
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:])) and len(set(texts)) > 2
    assert whole[0] == PROMPT + texts[-1] or whole[0].endswith(texts[-1])
    final = [r for r in responses if r.as_numpy("finish_reason") is not None][-1]
    assert final.as_numpy("finish_reason").reshape(-1)[0] == b"length"
    assert float(final.as_numpy("cumulative_logprob").reshape(-1)[0]) < 0


def test_a_stop_string_ends_and_is_cut_from_the_text(server, fresh_export: Path) -> None:
    """Stop strings match on their tokens (the LLM API encodes them without special tokens), end the generation
    with finish_reason "stop" and are cut from the text (include_stop_str_in_output is false)."""
    from tokenizers import Tokenizer

    from trtpipe.reference.hf_loader import hf_end_id
    from trtpipe.reference.runtime import ReferenceModel

    tokenizer = Tokenizer.from_file(str(fresh_export / "tokenizer.json"))
    prompt_ids = tokenizer.encode(PROMPT, add_special_tokens=True).ids
    model = ReferenceModel.load(fresh_export)
    ids = [t.token_id for t in model.generate(prompt_ids, max_new_tokens=MAX_TOKENS, end_id=hf_end_id(fresh_export),
                                              top_k=1)]
    # A generated token (not the first) whose text encodes back to exactly itself: a stop string that matches.
    first = next(i for i, t in enumerate(ids) if i > 0 and t not in ids[:i]
                 and tokenizer.encode(tokenizer.decode([t]), add_special_tokens=False).ids == [t])
    stop = tokenizer.decode([ids[first]])
    responses = _raw(server.grpc_url, {
        "text_input": np.array([PROMPT.encode()], dtype=object),
        "sampling_param_max_tokens": np.array([MAX_TOKENS], dtype=np.int32),
        "sampling_param_top_k": np.array([1], dtype=np.int32),
        "sampling_param_exclude_input_from_output": np.array([True]),
        "sampling_param_stop": np.array([stop.encode()], dtype=object),
        "return_finish_reason": np.array([True]),
        "return_stop_reason": np.array([True]),
    })
    final = [r for r in responses if r.as_numpy("text_output") is not None][-1]
    assert _text(final) == tokenizer.decode(ids[:first], skip_special_tokens=True)
    assert final.as_numpy("finish_reason").reshape(-1)[0] == b"stop"
    assert final.as_numpy("stop_reason").reshape(-1)[0].decode() == stop


@pytest.mark.parametrize("name,value,match", [
    ("lora_id", np.array([7], dtype=np.uint64), "lora_id"),
    ("image_url", np.array([b"https://example.com/x.png"], dtype=object), "image_url"),
    ("sampling_param_return_perf_metrics", np.array([True]), "sampling_param_return_perf_metrics"),
    ("sampling_param_best_of", np.array([2], dtype=np.int32), "sampling_param_best_of"),
])
def test_inputs_the_reference_cannot_honour_are_refused(server, name: str, value: np.ndarray, match: str) -> None:
    with pytest.raises(RuntimeError, match=match):
        _raw(server.grpc_url, {"text_input": np.array([PROMPT.encode()], dtype=object),
                               "sampling_param_max_tokens": np.array([4], dtype=np.int32), name: value})


def test_stop_is_answered_as_a_cancellation(server) -> None:
    """`stop` cancels the in-flight requests of its request id and is answered CANCELLED (upstream
    handle_stop_request); with nothing running under that id only the answer is sent."""
    with pytest.raises(RuntimeError, match="Request cancelled by client"):
        _raw(server.grpc_url, {"text_input": np.array([PROMPT.encode()], dtype=object), "stop": np.array([True])},
             request_id="nothing-running")


def test_limits_of_the_llm_arguments_are_enforced(server) -> None:
    client = TritonLLMClient(server.grpc_url, model="tensorrt_llm", timeout=120)
    with pytest.raises(TritonRequestError, match=r"should not exceed max_num_tokens \(64\)"):
        client.generate(" ".join(["word"] * 200), 4, top_k=1)
    with pytest.raises(TritonRequestError, match="exceeds max_seq_len 128"):
        client.generate(PROMPT, 126, top_k=1)


def test_streaming_needs_the_decoupled_deployment(unary_server) -> None:
    client = grpcclient.InferenceServerClient(unary_server.grpc_url)
    tensors = []
    for name, value, dtype in (("text_input", np.array([PROMPT.encode()], dtype=object), "BYTES"),
                               ("streaming", np.array([True]), "BOOL")):
        tensor = grpcclient.InferInput(name, [1], dtype)
        tensor.set_data_from_numpy(value)
        tensors.append(tensor)
    with pytest.raises(Exception, match="Streaming is only supported in decoupled mode"):
        client.infer("tensorrt_llm", tensors, client_timeout=120)
    client.close()


def test_client_keywords_without_an_llmapi_input_are_refused_before_sending(server) -> None:
    client = TritonLLMClient(server.grpc_url, model="tensorrt_llm", timeout=60)
    with pytest.raises(UsageError, match="end_id: the llmapi model has no such input"):
        client.generate(PROMPT, 4, end_id=-1)


def test_parity_fails_when_the_served_weights_differ(tmp_path: Path, streaming_repo: Path, fresh_export: Path) -> None:
    broken = tmp_path / "repo"
    shutil.copytree(streaming_repo, broken)  # copies: the artifact the other tests serve stays untouched
    for path in [broken, *broken.rglob("*")]:
        path.chmod(path.stat().st_mode | 0o200)
    weights = broken / ARTIFACT_DIR / "model.safetensors"
    tensors = load_file(str(weights))
    for key in [k for k in tensors if k.endswith("mlp.down_proj.pre_quant_scale")]:
        tensors[key] = tensors[key] * 3
    save_file(tensors, str(weights), metadata={"format": "pt"})
    with _serve(broken) as handle:
        result = run_smoke(handle.grpc_url, parity_engine=(fresh_export, fresh_export), max_tokens=MAX_TOKENS,
                           timeout=120)
    parity = next(c for c in result.checks if c.name == "parity")
    assert not parity.passed and "differ from the reference runtime" in parity.detail
