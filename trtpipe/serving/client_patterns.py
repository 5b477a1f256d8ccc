"""The request patterns upstream's own clients send, as checks a served repository must pass.

Read from the clients themselves (tensorrtllm_backend c2e65b88; copies later in TensorRT-LLM triton_backend/), and
from /work/shared/notes/upstream-clients.md:
- inflight_batcher_llm/client/end_to_end_grpc_client.py asks the ensemble or BLS for text_output alone (log-prob
  outputs only with --return-log-probs), over the streaming API whatever the deployment, and decodes
  as_numpy("text_output")[0] as bytes: text_output must be 1-D. With --batch-inputs several prompts travel in one
  request and each response names its prompt by batch_index.
- tools/inflight_batcher_llm/end_to_end_test.py calls with unary infer and compares preprocessing -> tensorrt_llm
  (with preprocessing's DECODER_INPUT_ID) -> postprocessing to the ensemble and BLS.
- inflight_batcher_llm_client.py sends `stop` with the request id to cancel a generation in flight.
- TensorRT-LLM triton_backend/tools/llmapi_client.py calls the llmapi model unary (async_infer) with text_input and
  sampling_param_max_tokens and no requested outputs.
The C++ backend refuses several prompts in one request, and streaming, outside a decoupled deployment
(utils.cc createRequestsFromInputTensors); upstream's clients hit the same refusal there, so a pattern that
the deployment cannot serve upstream either is accepted as refused, and said so.

Each check returns its one-line detail or raises CheckFailed; `trtpipe smoke` runs them (`pattern_checks`).
"""

from __future__ import annotations

import queue
import time
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
from pydantic import BaseModel

from trtpipe.errors import CheckFailed

DTYPES = {np.dtype(object): "BYTES", np.dtype(bool): "BOOL", np.dtype(np.int32): "INT32",
          np.dtype(np.float32): "FP32", np.dtype(np.uint64): "UINT64"}


class Refused(Exception):
    """The server answered a request with an error (its message is the exception's)."""


class Deployment(BaseModel):
    """What a pattern needs to know of the served model."""

    url: str
    model: str
    contract: str  # trtpipe.serving.client.Contract
    decoupled: bool
    max_batch_size: int
    models: list[str]
    prompts: list[str]
    max_tokens: int
    timeout: float


def _inputs(values: dict[str, np.ndarray]) -> list[Any]:
    import tritonclient.grpc as grpcclient

    tensors = []
    for name, value in values.items():
        tensor = grpcclient.InferInput(name, list(value.shape), DTYPES[value.dtype])
        tensor.set_data_from_numpy(value)
        tensors.append(tensor)
    return tensors


def stream_request(url: str, model: str, values: dict[str, np.ndarray], *, outputs: list[str] | None,
                   timeout: float, request_id: str | None = None,
                   on_first: Callable[[], None] | None = None) -> list[Any]:
    """One request over the streaming API; every response up to the final flag (empty final one included).
    `on_first` runs once, when the first response arrives. Raises Refused on an error response and CheckFailed
    when nothing arrives for `timeout` seconds."""
    import tritonclient.grpc as grpcclient

    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    got: list[Any] = []
    finished = False
    try:
        client.async_stream_infer(
            model, _inputs(values), request_id=request_id or uuid.uuid4().hex, enable_empty_final_response=True,
            outputs=None if outputs is None else [grpcclient.InferRequestedOutput(n) for n in outputs])
        while True:
            try:
                result, error = responses.get(timeout=timeout)
            except queue.Empty:
                raise CheckFailed(f"{model} sent no response (or no final one) within {timeout:g}s",
                                  check="patterns") from None
            if error is not None:
                finished = True
                raise Refused(error.message() if hasattr(error, "message") else str(error))
            if not got and on_first is not None:
                on_first()
            got.append(result)
            params = result.get_response().parameters
            if "triton_final_response" in params and params["triton_final_response"].bool_param:
                finished = True
                return got
    finally:
        client.stop_stream(cancel_requests=not finished)
        client.close()


def unary_request(url: str, model: str, values: dict[str, np.ndarray], *, outputs: list[str] | None,
                  timeout: float, request_id: str | None = None) -> Any:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(url)
    try:
        return client.infer(model, _inputs(values), request_id=request_id or "", client_timeout=timeout,
                            outputs=None if outputs is None else [grpcclient.InferRequestedOutput(n) for n in outputs])
    except InferenceServerException as err:
        raise Refused(err.message()) from None
    finally:
        client.close()


def texts_of(result: Any, model: str) -> list[str]:
    """text_output of one response, which must be 1-D (upstream's clients index [0] and decode bytes)."""
    array = result.as_numpy("text_output")
    if array is None:
        return []
    if array.ndim != 1:
        raise CheckFailed(f"{model}'s text_output has shape {list(array.shape)}; upstream's clients read "
                          "as_numpy('text_output')[0] as bytes, so it must be 1-D ([batch x beams])",
                          check="patterns", fix="return text_output as a 1-D tensor, as upstream's postprocessing does")
    return [x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x) for x in array]


def _request(d: Deployment, prompts: list[str], *, stream: bool, **extra: Any) -> dict[str, np.ndarray]:
    values = {
        "text_input": np.array([[p.encode("utf-8")] for p in prompts], dtype=object),
        "max_tokens": np.array([[d.max_tokens]] * len(prompts), dtype=np.int32),
        "stream": np.array([[stream]] * len(prompts), dtype=bool),
    }
    for name, (value, dtype) in extra.items():
        values[name] = np.array([[value]] * len(prompts), dtype=dtype)
    return values


def _send(d: Deployment, values: dict[str, np.ndarray], outputs: list[str] | None) -> list[Any]:
    return stream_request(d.url, d.model, values, outputs=outputs, timeout=d.timeout)


# --- inflight_batcher_llm (ensemble, tensorrt_llm_bls) -----------------------------------------------
def text_only(d: Deployment) -> str:
    """end_to_end_grpc_client.py: only text_output requested, streamed when the deployment streams."""
    responses = _send(d, _request(d, d.prompts[:1], stream=d.decoupled), ["text_output"])
    text = "".join(t for r in responses for t in texts_of(r, d.model))
    if not text:
        raise CheckFailed(f"{d.model} answered a request for text_output alone with no text", check="patterns")
    return f"text_output alone: {len(responses)} responses, {len(text)} characters"


def log_probs(d: Deployment) -> str:
    """end_to_end_grpc_client.py --return-log-probs: text_output, cum_log_probs and output_log_probs."""
    responses = _send(d, _request(d, d.prompts[:1], stream=False, return_log_probs=(True, bool)),
                      ["text_output", "cum_log_probs", "output_log_probs"])
    data = [r for r in responses if r.as_numpy("text_output") is not None]
    if not data or data[-1].as_numpy("output_log_probs") is None or data[-1].as_numpy("cum_log_probs") is None:
        raise CheckFailed(f"{d.model} sent no cum_log_probs / output_log_probs although return_log_probs was set",
                          check="patterns")
    logprobs = data[-1].as_numpy("output_log_probs").reshape(-1)
    cum = float(data[-1].as_numpy("cum_log_probs").reshape(-1)[0])
    if not logprobs.size or not np.all(np.isfinite(logprobs)) or np.any(logprobs > 0):
        raise CheckFailed(f"{d.model}'s output_log_probs are not log probabilities: {logprobs[:8].tolist()}",
                          check="patterns")
    if not np.isclose(cum, float(logprobs.sum()), rtol=1e-3, atol=1e-3):
        raise CheckFailed(f"{d.model}'s cum_log_probs {cum:.4f} is not the sum of its output_log_probs "
                          f"{float(logprobs.sum()):.4f}", check="patterns")
    return f"text + log probs: {logprobs.size} log probs, sum {cum:.3f}"


def all_outputs(d: Deployment) -> str:
    """No outputs named (every output): the generated ids and their log probs line up."""
    responses = _send(d, _request(d, d.prompts[:1], stream=False, return_log_probs=(True, bool),
                                  exclude_input_in_output=(True, bool)), None)
    data = [r for r in responses if r.as_numpy("output_ids") is not None]
    if not data:
        raise CheckFailed(f"{d.model} sent no output_ids when every output was asked for", check="patterns")
    last = data[-1]
    length = int(last.as_numpy("sequence_length").reshape(-1)[0])
    logprobs = last.as_numpy("output_log_probs")
    if logprobs is None or logprobs.reshape(-1).size != length:
        got = None if logprobs is None else logprobs.reshape(-1).size
        raise CheckFailed(f"{d.model}: {got} output_log_probs for {length} generated tokens (the C++ backend gives "
                          "one per generated token, none for the prompt)", check="patterns")
    texts_of(last, d.model)
    return f"every output: {length} tokens, {length} log probs"


def batch(d: Deployment) -> str:
    """end_to_end_grpc_client.py --batch-inputs: several prompts in one request, answered per batch_index."""
    prompts = d.prompts[: max(1, min(3, d.max_batch_size))]
    if len(prompts) < 2:
        return "skipped: max_batch_size 1 (one prompt per request)"
    try:
        responses = _send(d, _request(d, prompts, stream=False), ["text_output", "batch_index"])
    except Refused as err:
        if not d.decoupled and "decoupled" in str(err):
            return "several prompts in one request: refused (not decoupled), as the C++ backend does"
        raise CheckFailed(f"{d.model} refused {len(prompts)} prompts in one request: {err}", check="patterns",
                          fix="the C++ backend splits such a request on a decoupled deployment") from None
    texts: dict[int, str] = {}
    for r in responses:
        got = texts_of(r, d.model)
        if not got:
            continue
        index = r.as_numpy("batch_index")
        key = int(index.reshape(-1)[0]) if index is not None else 0
        texts[key] = texts.get(key, "") + got[0]
    if sorted(texts) != list(range(len(prompts))):
        raise CheckFailed(f"{len(prompts)} prompts in one request came back with batch_index {sorted(texts)}",
                          check="patterns", fix="answer each prompt with its batch_index, as the C++ backend does")
    for index, prompt in enumerate(prompts):
        alone = "".join(t for r in _send(d, _request(d, [prompt], stream=False), ["text_output"])
                        for t in texts_of(r, d.model))
        if texts[index] != alone:
            raise CheckFailed(f"prompt {index} of a batch answered {texts[index]!r}, alone {alone!r}",
                              check="patterns")
    return f"{len(prompts)} prompts in one request: one answer per batch_index, equal to each alone"


def unary(d: Deployment) -> str:
    """end_to_end_test.py: a plain unary infer, which Triton allows only on a model that is not decoupled."""
    if d.decoupled:
        return "skipped: Triton refuses unary calls to a decoupled model (upstream's too)"
    try:
        result = unary_request(d.url, d.model, _request(d, d.prompts[:1], stream=False), outputs=["text_output"],
                               timeout=d.timeout)
    except Refused as err:
        raise CheckFailed(f"{d.model} refused a unary request: {err}", check="patterns") from None
    text = texts_of(result, d.model)
    if not text or not text[0]:
        raise CheckFailed(f"{d.model} answered a unary request with no text", check="patterns")
    return f"unary infer: {len(text[0])} characters"


def stop(d: Deployment) -> str:
    """inflight_batcher_llm_client.py --stop-after-ms: `stop` with the request id, sent to tensorrt_llm, cancels
    the generation its ids asked for (the ids preprocessing makes of the first prompt)."""
    target = "tensorrt_llm"
    if target not in d.models:
        return f"skipped: no {target} model to send `stop` to"
    stop_values = {"input_ids": np.zeros((1, 1), dtype=np.int32), "input_lengths": np.array([[1]], dtype=np.int32),
                   "request_output_len": np.array([[1]], dtype=np.int32), "stop": np.array([[True]])}
    long_tokens = d.max_tokens * 4
    return stop_check(d, target, stop_values, _prompt_ids(d, long_tokens, streaming=d.decoupled), long_tokens,
                      cancelled_is_an_end=False)


def stop_check(d: Deployment, target: str, stop_values: dict[str, np.ndarray], values: dict[str, np.ndarray],
               long_tokens: int, *, cancelled_is_an_end: bool) -> str:
    """Send `values` (a request for `long_tokens` tokens) to `target` and `stop_values` with the same request id.

    Streaming: the stop goes out when the first token arrives. Not streaming: a stop goes out every 20 ms until the
    answer comes (a stop that arrives before the request is a no-op, as in the C++ backend's handleStopRequest).
    Whether the generation was cut depends on how fast the engine is; what must hold is that every stop is answered
    and the generation ends: with its last response, or (`cancelled_is_an_end`) with a CANCELLED error. The tokens
    generated are counted from `sequence_length` where the responses carry it."""
    request_id = uuid.uuid4().hex
    refusals: list[str] = []

    def send_stop() -> None:
        try:
            if d.decoupled:
                stream_request(d.url, target, stop_values, outputs=None, timeout=d.timeout, request_id=request_id)
            else:
                unary_request(d.url, target, stop_values, outputs=None, timeout=d.timeout, request_id=request_id)
        except Refused as err:
            if "cancel" not in str(err).lower():  # a stop that cancels may be answered with CANCELLED
                refusals.append(str(err))

    start = time.monotonic()
    try:
        if d.decoupled:
            responses = stream_request(d.url, target, values, outputs=None, timeout=d.timeout, request_id=request_id,
                                       on_first=send_stop)
        else:
            responses = [_unary_while_stopping(d, target, values, request_id, send_stop)]
        tokens = sum(int(r.as_numpy("sequence_length").reshape(-1)[0]) for r in responses
                     if r.as_numpy("sequence_length") is not None)
    except Refused as err:
        if not (cancelled_is_an_end and "cancel" in str(err).lower()):
            raise CheckFailed(f"{target} failed a request that was stopped: {err}", check="patterns") from None
        tokens = -1
    if refusals:
        raise CheckFailed(f"{target} refused `stop` for request id {request_id}: {refusals[0]}", check="patterns")
    seconds = time.monotonic() - start
    if tokens < 0:
        return f"stop: the request was cancelled ({seconds:.2f}s)"
    cut = "cut" if tokens < long_tokens else "finished before the stop landed"
    return f"stop: {tokens} of {long_tokens} tokens, {cut} ({seconds:.2f}s)"


def _unary_while_stopping(d: Deployment, model: str, values: dict[str, np.ndarray], request_id: str,
                          send_stop: Callable[[], None]) -> Any:
    """A unary request on a worker, with `send_stop` sent every 20 ms until its answer arrives."""
    import threading

    answer: list[Any] = []
    failure: list[Refused] = []

    def run() -> None:
        try:
            answer.append(unary_request(d.url, model, values, outputs=None, timeout=d.timeout, request_id=request_id))
        except Refused as err:
            failure.append(err)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    deadline = time.monotonic() + d.timeout
    while worker.is_alive() and time.monotonic() < deadline:
        send_stop()
        worker.join(timeout=0.02)
    worker.join(timeout=max(0.0, deadline - time.monotonic()))
    if failure:
        raise failure[0]
    if not answer:
        raise CheckFailed(f"{model} did not answer a stopped request within {d.timeout:g}s", check="patterns")
    return answer[0]


def _prompt_ids(d: Deployment, max_tokens: int, *, streaming: bool) -> dict[str, np.ndarray]:
    """tensorrt_llm's own inputs for the first prompt, made by the repository's preprocessing model."""
    result = unary_request(d.url, "preprocessing", {
        "QUERY": np.array([[d.prompts[0].encode("utf-8")]], dtype=object),
        "REQUEST_OUTPUT_LEN": np.array([[max_tokens]], dtype=np.int32)}, outputs=None, timeout=d.timeout)
    return {"input_ids": result.as_numpy("INPUT_ID").astype(np.int32),
            "input_lengths": result.as_numpy("REQUEST_INPUT_LEN").astype(np.int32),
            "request_output_len": np.array([[max_tokens]], dtype=np.int32),
            "end_id": result.as_numpy("OUT_END_ID").astype(np.int32),
            "pad_id": result.as_numpy("OUT_PAD_ID").astype(np.int32),
            "exclude_input_in_output": np.array([[True]]),
            "streaming": np.array([[streaming]])}


# The ensemble's and BLS's patterns (the inflight_batcher_llm request contract's; other contracts name theirs in
# trtpipe.serving.client.REQUEST_CONTRACTS).
INFLIGHT_PATTERNS: dict[str, Callable[[Deployment], str]] = {
    "text-only": text_only, "log-probs": log_probs, "all-outputs": all_outputs, "batch": batch, "unary": unary,
    "stop": stop,
}


def patterns_for(contract: str) -> dict[str, Callable[[Deployment], str]]:
    """The patterns upstream's clients send to a model of request contract `contract`, by name."""
    from trtpipe.serving.client import REQUEST_CONTRACTS

    return REQUEST_CONTRACTS[contract].client_patterns()


def describe(url: str, model: str, *, prompts: list[str], max_tokens: int, timeout: float) -> Deployment:
    """The served model's facts the patterns need (its config, the repository index)."""
    import tritonclient.grpc as grpcclient

    from trtpipe.serving.client import contract_of

    client = grpcclient.InferenceServerClient(url)
    try:
        config = client.get_model_config(model, as_json=True, client_timeout=timeout)["config"]
        metadata = client.get_model_metadata(model, as_json=True, client_timeout=timeout)
        index = client.get_model_repository_index(as_json=True, client_timeout=timeout).get("models", [])
    finally:
        client.close()
    return Deployment(
        url=url, model=model, contract=contract_of(metadata).name,
        decoupled=bool(config.get("model_transaction_policy", {}).get("decoupled", False)),
        max_batch_size=int(config.get("max_batch_size", 0) or 0), models=sorted({m["name"] for m in index if m.get("state")}),
        prompts=prompts, max_tokens=max_tokens, timeout=timeout)


def run_pattern(name: str, check: Callable[[Deployment], str], d: Deployment) -> str:
    try:
        return check(d)
    except Refused as err:
        raise CheckFailed(f"{d.model} refused upstream's {name} request: {err}", check="patterns") from None
