"""Both repository layouts, streaming and not, answer every request pattern of upstream's own clients, on the real
tritonserver (the clients' patterns: trtpipe.serving.client_patterns; facts: /work/shared/notes/upstream-clients.md).

The tests send what the clients send and check what the clients read; none of upstream's code is used."""

from __future__ import annotations

import json
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from trtpipe.errors import CheckFailed
from trtpipe.serving import client_patterns
from trtpipe.serving.client_patterns import Refused, stream_request, texts_of, unary_request
from trtpipe.settings import Settings

pytestmark = pytest.mark.timeout(600)

PROMPTS = ["Once upon a time", "The cat sat on the", "In the beginning there was"]
MAX_TOKENS = 24  # the stop pattern asks for 4x: 96 tokens, within the example's max_seq_len 128
DIGEST = "sha256:" + "2" * 64


def _serve(repo: Path):
    from trtpipe.serving.server import start_server

    return start_server(repo, start_timeout=180, settings=Settings.from_env())


@pytest.fixture(scope="module")
def unary_repo(example_repo: Path, tiny_llama_dir: Path, publish_example) -> Path:
    """The tiny example published with triton.streaming: false (same store as example_repo: engine reused)."""
    return publish_example(example_repo.parent.parent.parent, streaming=False, model_dir=tiny_llama_dir)


@pytest.fixture(scope="module")
def unary_ifb(unary_repo: Path) -> Iterator:
    with _serve(unary_repo) as handle:
        yield handle


def _llmapi_repo(tmp: Path, model_dir: Path, artifact: Path, streaming: bool | None) -> Path:
    from trtpipe.resolve import resolve
    from trtpipe.serving.llmapi_repository import publish_llmapi_repository
    from trtpipe.spec_loader import load_spec

    triton = "" if streaming is None else f"triton: {{streaming: {'true' if streaming else 'false'}}}\n"
    spec = tmp / "spec.yaml"
    spec.write_text(f"name: tiny-llmapi\nmodel: {{path: {json.dumps(str(model_dir))}, dtype: float16}}\n"
                    f"target: {{gpu: cpu-reference}}\nbackend: llm-api\n{triton}")
    return publish_llmapi_repository(resolve(load_spec(spec)), artifact, DIGEST, tmp / "repo")


@pytest.fixture(scope="module")
def llmapi_servers(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path, llmapi_artifact) -> Iterator:
    artifact = llmapi_artifact("llama", "none", "auto")
    streaming = _llmapi_repo(tmp_path_factory.mktemp("llmapi-s"), tiny_llama_dir, artifact, True)
    default = _llmapi_repo(tmp_path_factory.mktemp("llmapi-d"), tiny_llama_dir, artifact, None)
    with _serve(streaming) as s, _serve(default) as d:
        yield {"streaming": s, "default": d}


@pytest.fixture
def servers(request: pytest.FixtureRequest) -> dict:
    return {"ifb-streaming": lambda: request.getfixturevalue("triton_server"),
            "ifb-unary": lambda: request.getfixturevalue("unary_ifb"),
            "llmapi-streaming": lambda: request.getfixturevalue("llmapi_servers")["streaming"],
            "llmapi-default": lambda: request.getfixturevalue("llmapi_servers")["default"]}


def _deployment(url: str, model: str) -> client_patterns.Deployment:
    return client_patterns.describe(url, model, prompts=PROMPTS, max_tokens=MAX_TOKENS, timeout=120)


CASES = [("ifb-streaming", "ensemble"), ("ifb-streaming", "tensorrt_llm_bls"), ("ifb-unary", "ensemble"),
         ("ifb-unary", "tensorrt_llm_bls"), ("llmapi-streaming", "tensorrt_llm"), ("llmapi-default", "tensorrt_llm")]


@pytest.mark.parametrize("deployment,model", CASES)
def test_every_upstream_client_pattern_is_answered(servers: dict, deployment: str, model: str) -> None:
    d = _deployment(servers[deployment]().grpc_url, model)
    assert d.decoupled == deployment.endswith("streaming")
    details = {name: client_patterns.run_pattern(name, check, d)
               for name, check in client_patterns.patterns_for(d.contract).items()}
    # Generation runs off the stub's main thread in both policies, so a `stop` lands while tokens are still coming.
    assert "cut" in details["stop"] or "cancelled" in details["stop"], details["stop"]
    if d.contract == "inflight_batcher_llm":
        assert details["text-only"].startswith("text_output alone")
        if d.decoupled:
            assert "one answer per batch_index" in details["batch"]
            assert details["unary"].startswith("skipped")
        else:  # the C++ backend refuses several prompts outside decoupled mode, and so do we
            assert "refused (not decoupled)" in details["batch"]
            assert details["unary"].startswith("unary infer")
    elif not d.decoupled:  # llmapi_client.py's unary call; upstream's default echoes the prompt
        assert "echoes the prompt" in details["unary"]


def test_llmapi_defaults_to_a_unary_deployment_as_upstream(llmapi_servers) -> None:
    """Upstream's model.yaml ships triton_config.decoupled: False; a spec that says nothing gets the same."""
    d = _deployment(llmapi_servers["default"].grpc_url, "tensorrt_llm")
    assert not d.decoupled


def _tokens_of(repo_url: str, prompt: str, max_tokens: int) -> dict[str, np.ndarray]:
    return unary_request(repo_url, "preprocessing", {
        "QUERY": np.array([[prompt.encode()]], dtype=object),
        "BAD_WORDS_DICT": np.array([[b""]], dtype=object),
        "STOP_WORDS_DICT": np.array([[b""]], dtype=object),
        "REQUEST_OUTPUT_LEN": np.array([[max_tokens]], dtype=np.int32)}, outputs=None, timeout=60)


def test_preprocessing_tensorrt_llm_postprocessing_by_hand_equals_ensemble_and_bls(unary_ifb) -> None:
    """end_to_end_test.py's pattern: preprocessing's outputs, DECODER_INPUT_ID included (pad-only, which the C++
    backend ignores on a decoder-only engine), fed to tensorrt_llm, its ids to postprocessing; the text equals the
    ensemble's and the BLS's."""
    url = unary_ifb.grpc_url
    for prompt in PROMPTS:
        pre = _tokens_of(url, prompt, MAX_TOKENS)
        decoder = pre.as_numpy("DECODER_INPUT_ID")
        assert decoder.shape == (1, 1) and int(decoder[0, 0]) == int(pre.as_numpy("OUT_PAD_ID")[0, 0])
        assert pre.as_numpy("REQUEST_DECODER_INPUT_LEN").tolist() == [[1]]
        llm = unary_request(url, "tensorrt_llm", {
            "input_ids": pre.as_numpy("INPUT_ID"), "decoder_input_ids": decoder,
            "input_lengths": pre.as_numpy("REQUEST_INPUT_LEN"),
            "request_output_len": pre.as_numpy("REQUEST_OUTPUT_LEN"),
            "end_id": pre.as_numpy("OUT_END_ID"), "pad_id": pre.as_numpy("OUT_PAD_ID")}, outputs=None, timeout=60)
        post = unary_request(url, "postprocessing", {"TOKENS_BATCH": llm.as_numpy("output_ids"),
                                                     "SEQUENCE_LENGTH": llm.as_numpy("sequence_length")},
                             outputs=None, timeout=60)
        by_hand = texts_of(_OutputAsText(post), "postprocessing")
        request = {"text_input": np.array([[prompt.encode()]], dtype=object),
                   "max_tokens": np.array([[MAX_TOKENS]], dtype=np.int32),
                   "bad_words": np.array([[b""]], dtype=object), "stop_words": np.array([[b""]], dtype=object)}
        ensemble = texts_of(unary_request(url, "ensemble", request, outputs=["text_output"], timeout=60), "ensemble")
        bls = texts_of(unary_request(url, "tensorrt_llm_bls", request, outputs=["text_output"], timeout=60), "bls")
        assert by_hand == ensemble == bls and len(by_hand) == 1 and by_hand[0]


class _OutputAsText:
    """postprocessing names its text OUTPUT; texts_of reads text_output."""

    def __init__(self, result) -> None:
        self.result = result

    def as_numpy(self, name: str):
        return self.result.as_numpy("OUTPUT" if name == "text_output" else name)


def test_streamed_batch_deltas_add_up_per_prompt(triton_server) -> None:
    """Several prompts in one streamed request: each response is one prompt's delta, named by batch_index, and
    each prompt's deltas add up to its text alone (ensemble and BLS)."""
    url = triton_server.grpc_url
    for model in ("ensemble", "tensorrt_llm_bls"):
        values = {"text_input": np.array([[p.encode()] for p in PROMPTS], dtype=object),
                  "max_tokens": np.array([[MAX_TOKENS]] * 3, dtype=np.int32), "stream": np.array([[True]] * 3)}
        texts = {i: "" for i in range(3)}
        for response in stream_request(url, model, values, outputs=["text_output", "batch_index"], timeout=120):
            got = texts_of(response, model)
            if got:
                texts[int(response.as_numpy("batch_index").reshape(-1)[0])] += got[0]
        for index, prompt in enumerate(PROMPTS):
            alone = {"text_input": np.array([[prompt.encode()]], dtype=object),
                     "max_tokens": np.array([[MAX_TOKENS]], dtype=np.int32), "stream": np.array([[False]])}
            whole = "".join(t for r in stream_request(url, model, alone, outputs=["text_output"], timeout=120)
                            for t in texts_of(r, model))
            assert texts[index] == whole != "", (model, index)


def test_a_lone_prompt_gets_no_batch_index_and_log_probs_only_when_asked(unary_ifb) -> None:
    """As the C++ backend's fillTritonResponse: batch_index only for several prompts, log probs only with
    return_log_probs, and then one per generated token (none for the echoed prompt)."""
    pre = _tokens_of(unary_ifb.grpc_url, PROMPTS[0], 8)
    inputs = {"input_ids": pre.as_numpy("INPUT_ID"), "input_lengths": pre.as_numpy("REQUEST_INPUT_LEN"),
              "request_output_len": np.array([[8]], dtype=np.int32), "exclude_input_in_output": np.array([[False]])}
    plain = unary_request(unary_ifb.grpc_url, "tensorrt_llm", inputs, outputs=None, timeout=60)
    assert plain.as_numpy("batch_index") is None and plain.as_numpy("output_log_probs") is None
    prompt_len = int(pre.as_numpy("REQUEST_INPUT_LEN")[0, 0])
    assert int(plain.as_numpy("sequence_length")[0, 0]) == prompt_len + 8  # the prompt is echoed
    with_lp = unary_request(unary_ifb.grpc_url, "tensorrt_llm", {**inputs, "return_log_probs": np.array([[True]])},
                            outputs=None, timeout=60)
    assert with_lp.as_numpy("output_log_probs").shape == (1, 1, 8)
    assert with_lp.as_numpy("cum_log_probs").shape == (1, 1)


def test_tensorrt_llm_refuses_what_the_cpp_backend_refuses(unary_ifb) -> None:
    pre = _tokens_of(unary_ifb.grpc_url, PROMPTS[0], 4)
    inputs = {"input_ids": pre.as_numpy("INPUT_ID"), "input_lengths": pre.as_numpy("REQUEST_INPUT_LEN"),
              "request_output_len": np.array([[4]], dtype=np.int32)}
    with pytest.raises(Refused, match="Streaming is only supported if model is deployed using decoupled mode"):
        unary_request(unary_ifb.grpc_url, "tensorrt_llm", {**inputs, "streaming": np.array([[True]])},
                      outputs=None, timeout=60)
    with pytest.raises(Refused, match="output_ids tensor must be present"):
        unary_request(unary_ifb.grpc_url, "tensorrt_llm", inputs, outputs=["sequence_length"], timeout=60)
    with pytest.raises(Refused, match="request ID is not provided"):
        unary_request(unary_ifb.grpc_url, "tensorrt_llm", {**inputs, "stop": np.array([[True]])}, outputs=None,
                      timeout=60)


@pytest.mark.parametrize("deployment,model,body", [
    ("ifb-streaming", "ensemble", {"text_input": "Once upon a time", "max_tokens": 8}),
    ("ifb-streaming", "tensorrt_llm_bls", {"text_input": "Once upon a time", "max_tokens": 8}),
    ("ifb-unary", "ensemble", {"text_input": "Once upon a time", "max_tokens": 8}),
    ("ifb-unary", "tensorrt_llm_bls", {"text_input": "Once upon a time", "max_tokens": 8}),
    ("llmapi-default", "tensorrt_llm", {"text_input": "Once upon a time", "sampling_param_max_tokens": 8}),
])
def test_http_generate_answers_as_upstreams_docs_show(servers: dict, deployment: str, model: str, body: dict) -> None:
    server = servers[deployment]()
    request = urllib.request.Request(f"http://{server.http_url}/v2/models/{model}/generate",
                                     data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=120) as response:
        answer = json.loads(response.read())
    assert isinstance(answer["text_output"], str) and answer["text_output"].strip()


def test_the_patterns_fail_an_ensemble_wired_the_old_way(unary_repo: Path, tmp_path: Path) -> None:
    """The check can fail: an ensemble exposing the step's output_ids as an ensemble output AND feeding it to
    postprocessing is refused by validate, and served anyway, it cannot answer a request for text_output alone."""
    from trtpipe.serving.validate import validate_repository

    copy = tmp_path / "repo"
    shutil.copytree(unary_repo, copy)
    for path in [copy, *copy.rglob("*")]:
        path.chmod(path.stat().st_mode | 0o200)
    config = copy / "ensemble" / "config.pbtxt"
    text = config.read_text()
    text = text.replace('output_map { key: "output_ids" value: "_TOKENS_BATCH" }',
                        'output_map { key: "output_ids" value: "output_ids" }')
    text = text.replace('input_map { key: "TOKENS_BATCH" value: "_TOKENS_BATCH" }',
                        'input_map { key: "TOKENS_BATCH" value: "output_ids" }')
    text = text.replace('output_map { key: "sequence_length" value: "_SEQUENCE_LENGTH" }',
                        'output_map { key: "sequence_length" value: "sequence_length" }')
    text = text.replace('input_map { key: "SEQUENCE_LENGTH" value: "_SEQUENCE_LENGTH" }',
                        'input_map { key: "SEQUENCE_LENGTH" value: "sequence_length" }')
    text = text.replace('output_map { key: "OUT_TOKENS_BATCH" value: "output_ids" }\n', "")
    text = text.replace('output_map { key: "OUT_SEQUENCE_LENGTH" value: "sequence_length" }\n', "")
    config.write_text(text)
    issues = [i for i in validate_repository(copy) if i.severity == "error"]
    assert any(i.model == "ensemble" and i.field == "output[output_ids]" and "internal tensor" in i.fix
               for i in issues), [i.one_line() for i in issues]
    from trtpipe.serving.server import start_server

    with start_server(copy, start_timeout=180, validate=False, settings=Settings.from_env()) as broken:
        d = _deployment(broken.grpc_url, "ensemble")
        with pytest.raises(CheckFailed, match="refused upstream's text-only request"):
            client_patterns.run_pattern("text-only", client_patterns.text_only, d)


def test_a_two_dimensional_text_output_fails_the_shape_check() -> None:
    class Result:
        def as_numpy(self, name: str):
            return np.array([[b"hello"]], dtype=object)

    with pytest.raises(CheckFailed, match="must be 1-D"):
        texts_of(Result(), "ensemble")
