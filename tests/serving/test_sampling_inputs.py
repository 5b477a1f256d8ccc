"""The real tritonserver (cpu-reference) answers requests that use the sampling inputs of the upstream contract,
through the ensemble and the BLS model, with the tokens transformers produces for the same settings.

Error model: as in tests/reference/test_penalties.py, the served engine holds the float16 weights computed in
float32, so greedy choices equal those of `AutoModelForCausalLM(float16).float()` token for token.
presence/frequency: TensorRT-LLM's definition (penaltyKernels.cu batchApplyPenalty), written here as a
transformers logits processor.
"""

from __future__ import annotations

import queue
import threading
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch

from trtpipe.serving.client import TritonLLMClient, TritonRequestError

pytestmark = pytest.mark.timeout(300)

MODELS = ("ensemble", "tensorrt_llm_bls")
PROMPT = "The cat sat on the"
MAX_TOKENS = 16


class TrtllmPresenceFrequency:
    def __init__(self, presence: float, frequency: float) -> None:
        self.presence = presence
        self.frequency = frequency

    def __call__(self, input_ids, scores):
        counts = torch.stack([torch.bincount(row, minlength=scores.shape[-1]) for row in input_ids]).to(scores.dtype)
        return scores - self.presence * (counts > 0).to(scores.dtype) - self.frequency * counts


@pytest.fixture(scope="module")
def hf(tiny_llama_dir: Path, example_repo: Path):
    """generate(processors, eos, **kwargs) -> greedy ids from transformers for PROMPT, end token removed."""
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM, LogitsProcessorList

    from trtpipe.serving.smoke import end_id_of

    tokenizer_dir = example_repo / "preprocessing" / "tokenizer"
    prompt_ids = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).encode(PROMPT, add_special_tokens=True).ids
    default_end = end_id_of(tokenizer_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, torch_dtype=torch.float16).float().eval()

    def generate(processors=(), eos: int | None = None, **kwargs) -> list[int]:
        eos = default_end if eos is None else eos
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=MAX_TOKENS, do_sample=False,
                                 logits_processor=LogitsProcessorList(list(processors)), eos_token_id=eos,
                                 pad_token_id=eos, **kwargs)
        ids = out[0, len(prompt_ids):].tolist()
        return ids[: ids.index(eos)] if eos in ids else ids

    generate.prompt_ids = prompt_ids  # type: ignore[attr-defined]
    return generate


@pytest.fixture(scope="module")
def greedy(triton_server) -> list[int]:
    return TritonLLMClient(triton_server.grpc_url, timeout=60).generate(PROMPT, MAX_TOKENS, top_k=1).output_token_ids


def _generate(server, model: str, **kwargs) -> list[int]:
    return TritonLLMClient(server.grpc_url, model=model, timeout=60).generate(PROMPT, MAX_TOKENS, top_k=1, **kwargs).output_token_ids


@pytest.mark.parametrize("model", MODELS)
def test_repetition_penalty(triton_server, hf, greedy, model: str) -> None:
    got = _generate(triton_server, model, repetition_penalty=1.5)
    assert got == hf(repetition_penalty=1.5)
    assert got != greedy


@pytest.mark.parametrize("model", MODELS)
def test_presence_and_frequency_penalties(triton_server, hf, greedy, model: str) -> None:
    got = _generate(triton_server, model, presence_penalty=1.0, frequency_penalty=0.5)
    assert got == hf(processors=[TrtllmPresenceFrequency(1.0, 0.5)])
    assert got != greedy


@pytest.mark.parametrize("model", MODELS)
def test_min_tokens_holds_back_the_end_token(triton_server, hf, greedy, model: str) -> None:
    from transformers import MinNewTokensLengthLogitsProcessor

    end = greedy[1]  # a token greedy emits at step 1, used as the end token: without min_tokens it stops at once
    assert _generate(triton_server, model, end_id=end) == greedy[:1]
    got = _generate(triton_server, model, end_id=end, min_tokens=5)
    assert len(got) >= 5
    assert got == hf(processors=[MinNewTokensLengthLogitsProcessor(len(hf.prompt_ids), 5, end)], eos=end)


@pytest.mark.parametrize("model", MODELS)
def test_length_penalty_and_beam_width_1_keep_greedy(triton_server, greedy, model: str) -> None:
    assert _generate(triton_server, model, length_penalty=2.0, beam_width=1) == greedy


@pytest.mark.parametrize("model", MODELS)
def test_beam_width_above_1_is_refused_in_one_line(triton_server, model: str) -> None:
    with pytest.raises(TritonRequestError, match="beam_width 2 is not supported by the cpu-reference runtime") as info:
        _generate(triton_server, model, beam_width=2)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("model", MODELS)
def test_streaming_with_penalties_matches_unary(triton_server, model: str) -> None:
    client = TritonLLMClient(triton_server.grpc_url, model=model, timeout=60)
    kwargs = dict(top_k=1, repetition_penalty=1.3, presence_penalty=0.2, min_tokens=3)
    unary = client.generate(PROMPT, MAX_TOKENS, **kwargs).output_token_ids
    streamed = [t for chunk in client.stream(PROMPT, MAX_TOKENS, **kwargs) for t in chunk.token_ids]
    assert streamed == unary


def _stream_once(url: str, model: str, inputs: list, outputs: list[str], request_id: str | None = None,
                 on_response=None, timeout: float = 60) -> list:
    """All responses of one request over the streaming API (decoupled models), raising on an error."""
    import tritonclient.grpc as grpcclient

    from trtpipe.serving.client import is_final_response

    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        client.async_stream_infer(model, inputs, outputs=[grpcclient.InferRequestedOutput(n) for n in outputs],
                                  request_id=request_id or uuid.uuid4().hex, enable_empty_final_response=True)
        results = []
        while True:
            result, error = responses.get(timeout=timeout)
            if error is not None:
                raise RuntimeError(str(error))
            results.append(result)
            if on_response is not None:
                on_response(result)
            if is_final_response(result):
                return results
    finally:
        client.stop_stream()
        client.close()


def _tensor(name: str, value: np.ndarray):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import np_to_triton_dtype

    tensor = grpcclient.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
    tensor.set_data_from_numpy(value)
    return tensor


def test_num_input_and_output_tokens(triton_server, hf, greedy) -> None:
    from trtpipe.serving.client import build_inputs

    inputs = build_inputs(PROMPT, MAX_TOKENS, stream=False, top_k=1, return_num_input_tokens=True,
                          return_num_output_tokens=True)
    for model in MODELS:
        results = _stream_once(triton_server.grpc_url, model, inputs,
                               ["output_ids", "num_input_tokens", "num_output_tokens"])
        data = [r for r in results if r.as_numpy("num_output_tokens") is not None]
        assert len(data) == 1, model
        assert int(data[0].as_numpy("num_input_tokens").reshape(-1)[0]) == len(hf.prompt_ids)
        assert int(data[0].as_numpy("num_output_tokens").reshape(-1)[0]) == len(greedy)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(return_context_logits=True), "does not return context logits"),
        (dict(lora_task_id=7), "input lora_task_id .LoRA adapters. is not supported"),
        (dict(embedding_bias_words=["cat"]), "input EMBEDDING_BIAS_WORDS .an embedding bias. is not supported"),
    ],
)
def test_unsupported_inputs_are_refused_by_name(triton_server, kwargs: dict, match: str) -> None:
    from trtpipe.serving.client import build_inputs

    for model in MODELS:
        inputs = build_inputs(PROMPT, 4, stream=False)
        for name, value in kwargs.items():
            dtype = {bool: bool, int: np.uint64}.get(type(value), object)
            array = (np.array([[v.encode() for v in value]], dtype=object) if isinstance(value, list)
                     else np.array([[value]], dtype=dtype))
            inputs.append(_tensor(name, array))
        # output_ids is asked for as trtpipe's client does: seen here (Triton 2.51), an ensemble asked for
        # text_output alone answered a failed tensorrt_llm step with an empty final response and no error.
        with pytest.raises(RuntimeError, match=match) as info:
            _stream_once(triton_server.grpc_url, model, inputs, ["text_output", "output_ids"])
        assert "\n" not in str(info.value)


def test_stop_cancels_the_request_with_that_id(triton_server, hf) -> None:
    """upstream's `stop` input (tensorrt_llm): a request with stop=true cancels the in-flight request of that id.

    The stop goes out on its own connection after the second token arrives; on a loaded machine the server can
    finish all 100 tokens before it lands (the tiny engine's max_seq_len 128 allows no longer run). Such an
    attempt shows nothing, so it is tried again, up to three times; one attempt must end early."""
    prompt = np.array([hf.prompt_ids], dtype=np.int32)
    base = [
        _tensor("input_lengths", np.array([[prompt.shape[1]]], dtype=np.int32)),
        _tensor("request_output_len", np.array([[100]], dtype=np.int32)),
    ]
    generate = [_tensor("input_ids", prompt), *base, _tensor("end_id", np.array([[-1]], dtype=np.int32)),
                _tensor("streaming", np.array([[True]], dtype=bool))]
    counts: list[int] = []
    for _attempt in range(3):
        request_id = f"stop-test-{uuid.uuid4().hex}"
        stop_sent = threading.Event()
        received: list[int] = []

        def on_response(result, received=received, stop_sent=stop_sent, request_id=request_id) -> None:
            ids = result.as_numpy("output_ids")
            if ids is not None:
                received.extend(ids.reshape(-1).tolist())
            if len(received) >= 2 and not stop_sent.is_set():
                stop_sent.set()
                threading.Thread(target=lambda: _stream_once(
                    triton_server.grpc_url, "tensorrt_llm", [*base, _tensor("stop", np.array([[True]], dtype=bool))],
                    ["output_ids"], request_id=request_id), daemon=True).start()

        _stream_once(triton_server.grpc_url, "tensorrt_llm", generate, ["output_ids", "sequence_length"],
                     request_id=request_id, on_response=on_response, timeout=120)
        assert stop_sent.is_set()
        assert 2 <= len(received) <= 100
        counts.append(len(received))
        if len(received) < 100:
            break
    # 100 tokens were asked for and end_id -1 never matches: only the stop can end it this early.
    assert counts[-1] < 100, counts
