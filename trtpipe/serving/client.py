"""A small typed gRPC client for the trtpipe ensemble and BLS models, and for the llmapi model.

Every call has a timeout; a server that dies mid-stream surfaces as a TrtpipeError within the
client's timeout, never as a hang. Decoupled models (streaming deployments) are always called
through the streaming API, with the final-response flag handled whether it arrives on the last
data response or on a separate empty one.

Two request contracts, one `RequestContract` each (REQUEST_CONTRACTS), told apart by the served model's
metadata (`contract_of`); callers read the contract's facts and never compare its name:
- inflight_batcher_llm (ensemble, tensorrt_llm_bls): text_input, max_tokens, stream and the sampling inputs;
  responses carry the new text and its token ids (output_ids, sequence_length).
- llmapi (TensorRT-LLM's llmapi tensorrt_llm model, build_configs/triton_contracts/llmapi.yaml): text_input,
  streaming and sampling_param_*; responses carry text only, and a streamed text_output is the whole text so
  far (CompletionOutput.text), which this client turns back into deltas. It asks for the generated text alone
  (sampling_param_exclude_input_from_output, upstream's default being the prompt echoed).
Callers pass the same keyword arguments either way; one the llmapi model has no input for is refused, naming it.
"""

from __future__ import annotations

import queue
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import tritonclient.grpc as grpcclient
from pydantic import BaseModel, Field
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from trtpipe.errors import InvalidInput, RemoteError, TrtpipeError, UsageError
from trtpipe.serving.layouts import INFLIGHT_BATCHER_LLM, LLMAPI

OUTPUTS = ("text_output", "output_ids", "sequence_length")
# Produced only when the request sets return_log_probs (as the C++ backend does): asked for only then, since a
# non-decoupled ensemble fails a request for an output no step produced.
LOG_PROB_OUTPUTS = ("cum_log_probs", "output_log_probs")
LLMAPI_OUTPUTS = ("text_output",)

INFLIGHT = INFLIGHT_BATCHER_LLM  # the request contracts carry their layouts' names (trtpipe.serving.layouts)
Contract = Literal["inflight_batcher_llm", "llmapi"]
# The client's keyword arguments the llmapi model has inputs for (sampling_param_<name> unless mapped here).
LLMAPI_INPUTS = {
    "temperature": ("sampling_param_temperature", np.float32),
    "top_k": ("sampling_param_top_k", np.int32),
    "top_p": ("sampling_param_top_p", np.float32),
    "seed": ("sampling_param_seed", np.uint64),
    "presence_penalty": ("sampling_param_presence_penalty", np.float32),
    "frequency_penalty": ("sampling_param_frequency_penalty", np.float32),
}


class Generation(BaseModel):
    text: str
    output_token_ids: list[int]  # empty from an llmapi model (it returns text only)
    cum_log_prob: float | None = None
    output_log_probs: list[float] = Field(default_factory=list)
    model: str
    latency_s: float


class StreamChunk(BaseModel):
    text: str
    token_ids: list[int]
    t_received: float  # time.monotonic() when the response arrived
    is_final: bool


class TritonRequestError(InvalidInput):
    """The server answered a request with an error (too long a prompt, a bad parameter ...)."""


class TritonConnectionError(RemoteError):
    """The server could not be reached, or went away mid-request."""


class ModelProcessDied(TritonConnectionError):
    """A model's Python-backend process (its "stub") is dead: the server is up, but every request that
    reaches that model fails until the server is restarted (Triton does not restart it)."""

    def __init__(self, message: str, *, remote: str, dead_model: str, instance: str, fix: str | None = None) -> None:
        self.dead_model = dead_model
        self.instance = instance
        super().__init__(message, remote=remote, fix=fix)


# What the Python backend answers for a request to a model whose stub process is dead: triton-inference-server/
# python_backend r24.10 (01d0ad82) src/stub_launcher.cc:771-773 "Stub process '<instance>' is not healthy."
# (src/python_be.cc:1060 has the same text without the name). Triton 2.51.0 keeps reporting the server live,
# ready and the model ready meanwhile, and does not restart the stub (python_be.cc:2291-2293).
STUB_NOT_HEALTHY = re.compile(r"Stub process '([^']+)' is not healthy")


def dead_model(message: str, models: Iterable[str] = ()) -> tuple[str, str] | None:
    """(model, instance) named by a "Stub process '<instance>' is not healthy" message, else None.

    Triton names an instance `<group>_<n>`, and a group without a name `<model>_<index>` (a model without
    instance groups: `<model>`): triton-inference-server/core r24.10 (bfec7c61) src/model_config_utils.cc:811
    and :851, src/backend_model.cc:594. The model is the longest of `models` (the server's repository index)
    the instance name starts with; without that list, the instance name less its numeric suffixes.
    """
    match = STUB_NOT_HEALTHY.search(message)
    if match is None:
        return None
    instance = match.group(1)
    named = [m for m in models if instance.startswith(f"{m}_")]
    if named:
        return max(named, key=len), instance
    return re.sub(r"(?:_\d+){1,2}$", "", instance) or instance, instance


def _tensor(name: str, value: np.ndarray) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
    tensor.set_data_from_numpy(value)
    return tensor


def build_inputs(
    prompt: str,
    max_tokens: int,
    *,
    stream: bool,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    stop_words: list[str] | None = None,
    bad_words: list[str] | None = None,
    end_id: int | None = None,
    pad_id: int | None = None,
    exclude_input_in_output: bool | None = None,
    return_log_probs: bool | None = None,
    length_penalty: float | None = None,
    repetition_penalty: float | None = None,
    presence_penalty: float | None = None,
    frequency_penalty: float | None = None,
    min_tokens: int | None = None,
    beam_width: int | None = None,
    num_return_sequences: int | None = None,
    return_num_input_tokens: bool | None = None,
    return_num_output_tokens: bool | None = None,
) -> list[grpcclient.InferInput]:
    """The ensemble/BLS request tensors (batch of one); names and dtypes of the upstream contract."""
    inputs = [
        _tensor("text_input", np.array([[prompt.encode("utf-8")]], dtype=object)),
        _tensor("max_tokens", np.array([[max_tokens]], dtype=np.int32)),
        _tensor("stream", np.array([[stream]], dtype=bool)),
    ]
    scalars: list[tuple[str, Any, type]] = [
        ("temperature", temperature, np.float32),
        ("top_k", top_k, np.int32),
        ("top_p", top_p, np.float32),
        ("seed", seed, np.uint64),
        ("end_id", end_id, np.int32),
        ("pad_id", pad_id, np.int32),
        ("exclude_input_in_output", exclude_input_in_output, bool),
        ("return_log_probs", return_log_probs, bool),
        ("length_penalty", length_penalty, np.float32),
        ("repetition_penalty", repetition_penalty, np.float32),
        ("presence_penalty", presence_penalty, np.float32),
        ("frequency_penalty", frequency_penalty, np.float32),
        ("min_tokens", min_tokens, np.int32),
        ("beam_width", beam_width, np.int32),
        ("num_return_sequences", num_return_sequences, np.int32),
        ("return_num_input_tokens", return_num_input_tokens, bool),
        ("return_num_output_tokens", return_num_output_tokens, bool),
    ]
    for name, value, dtype in scalars:
        if value is not None:
            inputs.append(_tensor(name, np.array([[value]], dtype=dtype)))
    for name, words in (("stop_words", stop_words), ("bad_words", bad_words)):
        if words:
            inputs.append(_tensor(name, np.array([[w.encode("utf-8") for w in words]], dtype=object)))
    return inputs


def build_llmapi_inputs(
    prompt: str,
    max_tokens: int,
    *,
    stream: bool,
    stop_words: list[str] | None = None,
    exclude_input_in_output: bool | None = None,
    **sampling: Any,
) -> list[grpcclient.InferInput]:
    """The llmapi model's request tensors (max_batch_size 0: no batch dimension). `exclude_input_in_output`
    defaults to true here (generated text only); every other keyword must have an llmapi input."""
    inputs = [
        _tensor("text_input", np.array([prompt.encode("utf-8")], dtype=object)),
        _tensor("streaming", np.array([stream], dtype=bool)),
        _tensor("sampling_param_max_tokens", np.array([max_tokens], dtype=np.int32)),
        _tensor("sampling_param_exclude_input_from_output",
                np.array([True if exclude_input_in_output is None else exclude_input_in_output], dtype=bool)),
    ]
    for name, value in sampling.items():
        if value is None:
            continue
        if name not in LLMAPI_INPUTS:
            raise UsageError(f"{name}: the llmapi model has no such input (its sampling inputs: "
                             f"{', '.join(sorted(LLMAPI_INPUTS))}, stop_words)",
                             fix=f"omit {name} for an llm-api deployment")
        tensor_name, dtype = LLMAPI_INPUTS[name]
        inputs.append(_tensor(tensor_name, np.array([value], dtype=dtype)))
    if stop_words:
        inputs.append(_tensor("sampling_param_stop", np.array([w.encode("utf-8") for w in stop_words], dtype=object)))
    return inputs


def _inflight_outputs(log_probs: bool) -> tuple[str, ...]:
    return OUTPUTS + (LOG_PROB_OUTPUTS if log_probs else ())


def _llmapi_outputs(log_probs: bool) -> tuple[str, ...]:
    return LLMAPI_OUTPUTS  # no log-prob outputs in its contract


@dataclass(frozen=True)
class RequestContract:
    """How clients ask the model a repository layout serves, and how its answers read: the one place that
    knows (the smoke checks, the load generator and bench use these facts, never the contract's name)."""

    name: Contract
    build_inputs: Callable[..., list[grpcclient.InferInput]]  # (prompt, max_tokens, *, stream, **sampling)
    output_names: Callable[[bool], tuple[str, ...]]  # (log probs asked for) -> the outputs to request
    required_inputs: tuple[str, ...]  # what its metadata must declare for trtpipe's requests
    returns_token_ids: bool  # False: text only (output tokens are counted with the served tokenizer)
    cumulative_stream: bool  # a streamed text_output is the whole text so far, not the new piece
    takes_end_id: bool  # an end_id input (bench --ignore-eos sends end_id=-1)
    # The request patterns of upstream's clients for it, by name (trtpipe.serving.client_patterns: smoke runs them).
    client_patterns: Callable[[], dict[str, Callable[..., str]]]

    def outputs(self, *, log_probs: bool = False) -> tuple[str, ...]:
        return self.output_names(log_probs)


def _inflight_patterns() -> dict[str, Callable[..., str]]:
    from trtpipe.serving.client_patterns import INFLIGHT_PATTERNS

    return INFLIGHT_PATTERNS


def _llmapi_patterns() -> dict[str, Callable[..., str]]:
    from trtpipe.serving.llmapi_patterns import PATTERNS

    return PATTERNS


REQUEST_CONTRACTS: dict[str, RequestContract] = {
    INFLIGHT: RequestContract(
        name=INFLIGHT, build_inputs=build_inputs, output_names=_inflight_outputs,
        required_inputs=("text_input", "max_tokens"), returns_token_ids=True, cumulative_stream=False,
        takes_end_id=True, client_patterns=_inflight_patterns),
    LLMAPI: RequestContract(
        name=LLMAPI, build_inputs=build_llmapi_inputs, output_names=_llmapi_outputs,
        required_inputs=("text_input", "sampling_param_max_tokens"), returns_token_ids=False,
        cumulative_stream=True, takes_end_id=False, client_patterns=_llmapi_patterns),
}


# What a model speaks until its metadata says otherwise: the default layout's contract (the ensemble's).
DEFAULT_CONTRACT = REQUEST_CONTRACTS[INFLIGHT]


def contract_of(metadata: dict[str, Any]) -> RequestContract:
    """Which request contract a model speaks, from its gRPC metadata (as_json)."""
    names = {t["name"] for t in metadata.get("inputs", [])}
    if "sampling_param_max_tokens" in names and "max_tokens" not in names:
        return REQUEST_CONTRACTS[LLMAPI]
    return DEFAULT_CONTRACT


DEFAULT_MODEL = "ensemble"
LLMAPI_MODEL = "tensorrt_llm"


def resolve_model(url: str, model: str = DEFAULT_MODEL, *, timeout: float = 30) -> tuple[str, RequestContract]:
    """The model to call at `url` and the contract it speaks. The default model (the ensemble) stands for the
    llmapi model on a server that serves an llmapi repository, which has no ensemble: callers written for
    either deployment work unchanged. Any other name is taken as given."""
    client = grpcclient.InferenceServerClient(url)
    try:
        try:
            names = {m["name"] for m in client.get_model_repository_index(as_json=True, client_timeout=timeout)
                     .get("models", [])}
            if model == DEFAULT_MODEL and model not in names and LLMAPI_MODEL in names:
                metadata = client.get_model_metadata(LLMAPI_MODEL, as_json=True, client_timeout=timeout)
                contract = contract_of(metadata)
                if contract.name == LLMAPI:  # the llmapi layout's own model, the one it serves
                    return LLMAPI_MODEL, contract
            if model not in names:
                return model, DEFAULT_CONTRACT  # the caller's own checks say the model is missing
            return model, contract_of(client.get_model_metadata(model, as_json=True, client_timeout=timeout))
        except InferenceServerException as err:
            raise TritonConnectionError(f"cannot ask {url} which models it serves: {err.message()}", remote=url,
                                        fix="check that the server is running and reachable") from None
    finally:
        client.close()


def text_delta(previous: str, text: str) -> str:
    """The new part of a cumulative llmapi text_output; if the text does not extend the previous one (a cut
    stop string), what follows their common prefix."""
    if text.startswith(previous):
        return text[len(previous):]
    common = 0
    while common < min(len(previous), len(text)) and previous[common] == text[common]:
        common += 1
    return text[common:]


def _decode(result: Any) -> tuple[str, list[int], float | None, list[float]]:
    """text, token ids, cum log prob, log probs of one response (empty for an empty final response)."""
    text_array = result.as_numpy("text_output")
    if text_array is None:
        return "", [], None, []
    text = b"".join(x if isinstance(x, bytes) else str(x).encode() for x in text_array.reshape(-1)).decode("utf-8", "replace")
    ids_array = result.as_numpy("output_ids")
    length_array = result.as_numpy("sequence_length")
    ids: list[int] = []
    if ids_array is not None:
        flat = ids_array.reshape(-1)
        n = int(length_array.reshape(-1)[0]) if length_array is not None and length_array.size else flat.size
        ids = flat[:n].astype(np.int64).tolist()
    cum = result.as_numpy("cum_log_probs")
    logprobs = result.as_numpy("output_log_probs")
    return (
        text,
        ids,
        float(cum.reshape(-1)[0]) if cum is not None and cum.size else None,
        logprobs.reshape(-1)[: len(ids)].astype(float).tolist() if logprobs is not None else [],
    )


def is_final_response(result: Any) -> bool:
    """Whether a streamed response carries Triton's final flag (it may also carry data)."""
    params = result.get_response().parameters
    return "triton_final_response" in params and params["triton_final_response"].bool_param


class TritonLLMClient:
    """Text in, text out against the `ensemble` (default) or `tensorrt_llm_bls` model."""

    def __init__(self, url: str, model: str = "ensemble", timeout: float = 30) -> None:
        self.url = url
        self.model = model
        self.timeout = timeout
        self._decoupled: bool | None = None
        self._contract: RequestContract | None = None

    def _client(self) -> grpcclient.InferenceServerClient:
        return grpcclient.InferenceServerClient(self.url)

    def _connection_error(self, err: Exception, doing: str) -> TrtpipeError:
        """A server-side refusal (status None on a stream, or a non-transport code) vs a lost connection;
        a model whose backend process died is neither (the request was fine, the server is not)."""
        transport = ("StatusCode.UNAVAILABLE", "StatusCode.DEADLINE_EXCEEDED", "StatusCode.CANCELLED")
        text = err.message() if isinstance(err, InferenceServerException) else str(err)
        dead = dead_model(text or "", self._model_names()) if STUB_NOT_HEALTHY.search(text or "") else None
        if dead is not None:
            model, instance = dead
            return ModelProcessDied(
                f"the model {model}'s backend process died or hangs ({self.model} at {self.url}: {text.strip()})",
                remote=self.url, dead_model=model, instance=instance,
                fix="the server must be restarted (Triton does not restart a dead Python-backend process); "
                    "if it was killed for memory, give the host more",
            )
        if isinstance(err, InferenceServerException) and err.status() not in transport:
            return TritonRequestError(f"{self.model} at {self.url} refused the request: {err.message()}",
                                      fix="check the prompt and parameters against the engine's limits")
        return TritonConnectionError(f"Triton at {self.url} failed while {doing}: {err}", remote=self.url,
                                     fix="check that the server is running and reachable")

    def _model_names(self) -> list[str]:
        """The server's model names (to read an instance name back to its model); empty if it cannot say."""
        client = self._client()
        try:
            return [m["name"] for m in client.get_model_repository_index(as_json=True, client_timeout=5).get("models", [])]
        except Exception:  # noqa: BLE001 - only a better name is lost; the suffix rule still names the model
            return []
        finally:
            _quietly(client.close)

    def is_decoupled(self) -> bool:
        if self._decoupled is None:
            client = self._client()
            try:
                config = client.get_model_config(self.model, as_json=True, client_timeout=self.timeout)["config"]
            except InferenceServerException as err:
                raise self._connection_error(err, f"reading the config of {self.model}") from None
            finally:
                client.close()
            self._decoupled = bool(config.get("model_transaction_policy", {}).get("decoupled", False))
        return self._decoupled

    def contract(self) -> RequestContract:
        """The request contract the served model speaks (from its metadata; asked once)."""
        if self._contract is None:
            client = self._client()
            try:
                metadata = client.get_model_metadata(self.model, as_json=True, client_timeout=self.timeout)
            except InferenceServerException as err:
                raise self._connection_error(err, f"reading the metadata of {self.model}") from None
            finally:
                client.close()
            self._contract = contract_of(metadata)
        return self._contract

    def _inputs(self, prompt: str, max_tokens: int, *, stream: bool, **sampling: Any) -> list[grpcclient.InferInput]:
        return self.contract().build_inputs(prompt, max_tokens, stream=stream, **sampling)

    def _outputs(self, sampling: dict[str, Any]) -> list[grpcclient.InferRequestedOutput]:
        names = self.contract().outputs(log_probs=bool(sampling.get("return_log_probs")))
        return [grpcclient.InferRequestedOutput(n) for n in names]

    def generate(self, prompt: str, max_tokens: int, **sampling: Any) -> Generation:
        """One complete generation (stream=false). On an llmapi model `output_token_ids` is empty (it returns text)."""
        start = time.monotonic()
        if self.is_decoupled():
            parts = list(self._stream_results(prompt, max_tokens, stream=False, **sampling))
            text = "".join(p[1] for p in parts)
            ids = [i for p in parts for i in p[2]]
            cum = next((p[3] for p in parts if p[3] is not None), None)
            logprobs = [x for p in parts for x in p[4]]
        else:
            client = self._client()
            try:
                result = client.infer(
                    self.model, self._inputs(prompt, max_tokens, stream=False, **sampling),
                    outputs=self._outputs(sampling), client_timeout=self.timeout,
                )
            except InferenceServerException as err:
                raise self._connection_error(err, "generating") from None
            finally:
                client.close()
            text, ids, cum, logprobs = _decode(result)
        return Generation(text=text, output_token_ids=ids, cum_log_prob=cum, output_log_probs=logprobs,
                          model=self.model, latency_s=time.monotonic() - start)

    def stream(self, prompt: str, max_tokens: int, **sampling: Any) -> Iterator[StreamChunk]:
        """Token-by-token text deltas (stream=true); needs a decoupled (streaming) deployment."""
        if not self.is_decoupled():
            raise UsageError(f"{self.model} at {self.url} is not decoupled, so it cannot stream",
                             fix="publish with runtime.streaming: true, or call generate()")
        for t_received, text, ids, _cum, _lp, final in self._stream_results(prompt, max_tokens, stream=True, **sampling):
            yield StreamChunk(text=text, token_ids=ids, t_received=t_received, is_final=final)

    def _stream_results(self, prompt: str, max_tokens: int, *, stream: bool, **sampling: Any):
        """(t_received, text, ids, cum, logprobs, is_final) per response, through the streaming API.

        Each call owns its gRPC client (one stream per client), so many streams may run at once.
        Waiting for each response is bounded by `timeout`; an error from the stream (the server
        went away) or the timeout raises TrtpipeError.
        """
        responses: queue.Queue[tuple[Any, Any, float]] = queue.Queue()

        def on_response(result: Any, error: Any) -> None:
            responses.put((result, error, time.monotonic()))

        cumulative = self.contract().cumulative_stream
        seen = ""
        client = self._client()
        finished = False
        try:
            try:
                client.start_stream(callback=on_response)
                inputs, outputs = self._inputs(prompt, max_tokens, stream=stream, **sampling), self._outputs(sampling)
                client.async_stream_infer(
                    self.model, inputs, outputs=outputs,
                    request_id=uuid.uuid4().hex, enable_empty_final_response=True,
                )
            except InferenceServerException as err:
                raise self._connection_error(err, "opening a stream") from None
            while True:
                try:
                    result, error, t_received = responses.get(timeout=self.timeout)
                except queue.Empty:
                    raise TritonConnectionError(
                        f"no response from {self.model} at {self.url} within {self.timeout:g}s",
                        remote=self.url,
                        fix="check the server (it may have died or be overloaded); raise the client timeout if it is just slow",
                    ) from None
                if error is not None:
                    raise self._connection_error(error, "streaming") from None
                final = is_final_response(result)
                text, ids, cum, logprobs = _decode(result)
                if cumulative:  # the whole text so far (llmapi); hand on what is new
                    text, seen = text_delta(seen, text), text if (text or not final) else seen
                if ids or text or final:
                    yield t_received, text, ids, cum, logprobs, final
                if final:
                    finished = True
                    return
        finally:
            self._close_stream(client, cancel=not finished)

    def _close_stream(self, client: grpcclient.InferenceServerClient, *, cancel: bool) -> None:
        # stop_stream joins the stream's thread; bound it so a dead server cannot hang us.
        closer = threading.Thread(target=lambda: _quietly(client.stop_stream, cancel_requests=cancel), daemon=True)
        closer.start()
        closer.join(timeout=self.timeout)
        _quietly(client.close)


def _quietly(fn: Any, **kwargs: Any) -> None:
    try:
        fn(**kwargs)
    except Exception:
        pass
