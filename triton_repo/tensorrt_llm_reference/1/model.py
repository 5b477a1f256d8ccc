"""trtpipe tensorrt_llm model for the cpu-reference target (Triton Python backend).

Serves a reference engine (TRT-LLM checkpoint + engine config.json) through
`trtpipe.reference.runtime.ReferenceModel` behind the inputs and outputs of the TensorRT-LLM C++ backend, and answers
the way that backend does, so upstream's own clients, the ensemble and BLS behave here as on a GPU. Facts read from
the backend (tensorrtllm_backend c2e65b88, inflight_batcher_llm/src/):
- A request holding several prompts (batch dimension > 1) is split into one generation per prompt, each answered with
  its own responses, and only a decoupled deployment may do that; streaming also needs a decoupled deployment
  (utils.cc createRequestsFromInputTensors refuses both otherwise, with the words used below).
- Each response carries only the outputs the request asked for; output_ids and sequence_length must be among them
  (model_instance_state.cc fillTritonResponse). batch_index is sent only when asked for and the request holds more than
  one prompt; sequence_index only when asked for and num_return_sequences > 1 (never here: refused).
- cum_log_probs / output_log_probs exist only with return_log_probs, and cover generated tokens, never the prompt
  (TensorRT-LLM cpp/tensorrt_llm/batch_manager/llmRequest.cpp createResult, code index 89fd9b74).
- Streaming responses carry only the new tokens, the last one with the final flag; a non-streaming response carries
  the prompt too unless exclude_input_in_output (createResult). The final flag goes on the last response of the
  last prompt to finish (model_instance_state.cc WaitForResponse: signalFinal when no batched request is pending).
- `stop` = true cancels the in-flight requests with the same request id and is answered by an empty final response
  (handleStopRequest); a cancelled request ends with what it generated so far.
- max_attention_window_size (the parameter) sets each layer's attention window, as the backend's KV cache config does.
- decoder_input_ids / decoder_input_lengths are read only for encoder-decoder engines (createRequestsFromInputTensors):
  on this decoder-only runtime they are ignored, whatever they hold.
- Like the C++ backend, which enqueues and answers from its own thread, generation never runs in `execute`: each
  prompt generates on a worker thread and answers through the response sender (in both transaction policies), so a
  slow request holds no other up and a `stop` is served while a generation runs.

Also honoured: the sampling inputs (temperature, top-k/p, seed, repetition / presence / frequency penalties,
min_tokens), stop and bad words, end and pad ids, beam_width 1 (other widths are refused), len_penalty /
early_stopping / beam_search_diversity_rate (beam-search settings: accepted, no effect at beam width 1),
num_return_sequences 1, return_num_input_tokens / return_num_output_tokens, and the KV-cache retention hints (cache
eviction priorities: no effect on results, ignored). Everything else (LoRA, prompt tables, encoder-decoder inputs, draft
tokens, guided decoding, lookahead, multimodal, embedding bias, top-p decay, logits and perf-metric outputs) is refused
with a one-line error naming the input when a request carries it.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _param(model_config: dict, key: str, default: str = "") -> str:
    return model_config.get("parameters", {}).get(key, {}).get("string_value", default)


class RequestError(ValueError):
    """A request the engine refuses (too long, malformed): reported to the client."""


class Inputs:
    """One Triton request's tensors, read per prompt of its batch."""

    def __init__(self, request) -> None:
        self.request = request
        ids = pb_utils.get_input_tensor_by_name(request, "input_ids")
        if ids is None:
            raise RequestError("input_ids is missing: the cpu-reference runtime needs the prompt's token ids "
                               "(upstream leaves it optional only for encoder-decoder and prompt-table requests)")
        array = ids.as_numpy()
        self.input_ids = array.reshape(-1, array.shape[-1]) if array.ndim > 1 else array.reshape(1, -1)
        self.batch = self.input_ids.shape[0]

    def array(self, name: str):
        tensor = pb_utils.get_input_tensor_by_name(self.request, name)
        return None if tensor is None else tensor.as_numpy()

    def scalar(self, name: str, row: int, default=None):
        """The value of input `name` for prompt `row` (a tensor of one row applies to every prompt)."""
        array = self.array(name)
        if array is None or array.size == 0:
            return default
        flat = array.reshape(array.shape[0], -1) if array.ndim > 0 else array.reshape(1, 1)
        return flat[row if flat.shape[0] > row else 0][0].item()

    def words(self, name: str, row: int) -> list[list[int]]:
        """The [batch, 2, L] stop/bad words tensor's row -> token-id sequences (row 1 holds end offsets, -1 padded)."""
        array = self.array(name)
        if array is None or array.size == 0:
            return []
        array = array.reshape(-1, 2, array.shape[-1])
        ids, ends = array[row if array.shape[0] > row else 0]
        words, start = [], 0
        for end in (int(e) for e in ends if e >= 0):
            if end > start:
                words.append(ids[start:end].tolist())
            start = end
        return words


# Inputs the reference runtime cannot honour: a request that carries one (non-empty) is refused, naming it.
UNSUPPORTED_INPUTS = {
    "encoder_input_features": "encoder-decoder models",
    "encoder_output_lengths": "encoder-decoder models",
    "draft_input_ids": "speculative decoding with draft tokens",
    "draft_logits": "speculative decoding with draft tokens",
    "draft_acceptance_threshold": "speculative decoding with draft tokens",
    "embedding_bias": "an embedding bias",
    "runtime_top_p_min": "top-p decay",
    "runtime_top_p_decay": "top-p decay",
    "runtime_top_p_reset_ids": "top-p decay",
    "prompt_embedding_table": "prompt tuning tables",
    "prompt_table_extra_ids": "prompt tuning tables",
    "prompt_vocab_size": "prompt tuning tables",
    "cross_attention_mask": "cross attention (multimodal)",
    "skip_cross_attn_blocks": "cross attention (multimodal)",
    "mrope_rotary_cos_sin": "mrope (multimodal)",
    "mrope_position_deltas": "mrope (multimodal)",
    "lora_task_id": "LoRA adapters",
    "lora_weights": "LoRA adapters",
    "lora_config": "LoRA adapters",
    "context_phase_params": "disaggregated serving",
    "guided_decoding_guide_type": "guided decoding",
    "guided_decoding_guide": "guided decoding",
    "lookahead_window_size": "lookahead decoding",
    "lookahead_ngram_size": "lookahead decoding",
    "lookahead_verification_set_size": "lookahead decoding",
}
# Output switches the reference runtime cannot serve: refused when true.
UNSUPPORTED_SWITCHES = {
    "return_context_logits": "context logits",
    "return_generation_logits": "generation logits",
    "return_perf_metrics": "perf metrics (KV-cache block counts and scheduler timings)",
}
REQUIRED_OUTPUTS = ("output_ids", "sequence_length")


def _carries(array) -> bool:
    """A tensor that is present and holds something (preprocessing sends empty placeholders)."""
    if array is None or array.size == 0:
        return False
    if array.dtype == np.float32 and not np.any(array):
        return False  # an all-zero embedding bias changes nothing
    return True


class Answer:
    """The response sender of one Triton request, shared by the generations of its prompts.

    Sends are serialized; the final flag goes on the last response of the last generation to finish."""

    def __init__(self, sender, pending: int, requested: set[str], batch: int) -> None:
        self.sender = sender
        self.pending = pending
        self.requested = requested
        self.batch = batch
        self.lock = threading.Lock()

    def cancelled(self) -> bool:
        return bool(getattr(self.sender, "is_cancelled", lambda: False)())

    def send(self, response, *, last: bool) -> None:
        with self.lock:
            if last:
                self.pending -= 1
            self.sender.send(response, flags=FINAL if last and self.pending == 0 else 0)


class TritonPythonModel:
    def initialize(self, args):
        from trtpipe.reference.runtime import ReferenceModel  # the venv's trtpipe (editable install)

        self.model_config = json.loads(args["model_config"])
        model_dir = Path(args["model_repository"])
        engine_dir = Path(_param(self.model_config, "gpt_model_path", "1"))
        if not engine_dir.is_absolute():
            engine_dir = model_dir / engine_dir
        engine_config = json.loads((engine_dir / "config.json").read_text())
        # Like the C++ backend, which checks the engine's logits type against the declared one: refuse to load when
        # config.pbtxt declares the logits outputs otherwise than the engine's logits_dtype (TensorRT-LLM's default
        # when absent: float32), so the same mismatch fails here too.
        engine_logits = engine_config.get("pretrained_config", {}).get("logits_dtype") or "float32"
        wanted = {"float32": "TYPE_FP32", "float16": "TYPE_FP16"}.get(engine_logits, f"no type for {engine_logits}")
        for output in self.model_config.get("output", []):
            if output["name"] in ("context_logits", "generation_logits") and output["data_type"] != wanted:
                raise ValueError(f"config.pbtxt: output {output['name']} is {output['data_type']} but the engine's "
                                 f"logits_dtype is {engine_logits} ({engine_dir / 'config.json'}); declare it {wanted} "
                                 "(publish again)")
        build = engine_config.get("build_config", {})
        self.max_input_len = int(build["max_input_len"])
        self.max_seq_len = int(build["max_seq_len"])
        self.vocab_size = int(engine_config.get("pretrained_config", {}).get("vocab_size", 0)) or None
        self.exclude_input_default = _param(self.model_config, "exclude_input_in_output", "true") == "true"
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(self.model_config)
        self.model = ReferenceModel.load(engine_dir)
        # The attention window per layer, read as the C++ backend reads it (a comma list, repeated over the layers;
        # getKvCacheConfigFromParams): a checkpoint carries none.
        window = _param(self.model_config, "max_attention_window_size", "")
        if window:
            self.model.set_attention_windows([int(w) for w in window.split(",")])
        # At most max_batch_size prompts generate at once, like the in-flight batcher's slots.
        self.slots = threading.BoundedSemaphore(max(1, int(self.model_config.get("max_batch_size", 1))))
        self.lock = threading.Lock()
        self.threads: set[threading.Thread] = set()
        self.running: dict[str, set[int]] = {}  # Triton request id -> our generation ids (for `stop`)
        self.cancelled: set[int] = set()
        self.next_job = 0

    # --- request parsing -------------------------------------------------------------------
    def _refuse_unsupported(self, inputs: Inputs) -> None:
        for name, feature in UNSUPPORTED_INPUTS.items():
            if _carries(inputs.array(name)):
                raise RequestError(f"input {name} ({feature}) is not supported by the cpu-reference runtime; "
                                   "omit it, or serve a TensorRT engine on a GPU target")
        for name, output in UNSUPPORTED_SWITCHES.items():
            for row in range(inputs.batch):
                if bool(inputs.scalar(name, row, False)):
                    raise RequestError(f"{name}: the cpu-reference runtime does not return {output}; send {name}=false")

    def _prompts(self, request) -> list[dict]:
        """One generation's settings per prompt of the request; refuses what the C++ backend refuses."""
        inputs = Inputs(request)
        if inputs.batch > 1 and not self.decoupled:
            raise RequestError("Batch size > 1 requires the tensorrt_llm backend to be using decoupled transaction "
                               "policy; send one prompt per request, or publish with triton.streaming: true")
        self._refuse_unsupported(inputs)
        return [self._prompt(inputs, row) for row in range(inputs.batch)]

    def _prompt(self, inputs: Inputs, row: int) -> dict:
        length = int(inputs.scalar("input_lengths", row, inputs.input_ids.shape[-1]))
        prompt = inputs.input_ids[row, :length].astype(np.int64).tolist()
        streaming = bool(inputs.scalar("streaming", row, False))
        if streaming and not self.decoupled:
            raise RequestError("Streaming is only supported if model is deployed using decoupled mode; "
                               "publish with triton.streaming: true, or send stream=false")
        max_new = inputs.scalar("request_output_len", row)
        if max_new is None:
            raise RequestError("request_output_len is not present in the request")
        max_new = int(max_new)
        if length > self.max_input_len:
            raise RequestError(
                f"input length {length} exceeds the engine's max_input_len {self.max_input_len}; "
                "shorten the prompt or rebuild with a larger engine.max_input_len"
            )
        if max_new < 1:
            raise RequestError(f"request_output_len {max_new} must be at least 1")
        if length + max_new > self.max_seq_len:
            raise RequestError(
                f"input length {length} + request_output_len {max_new} exceeds the engine's max_seq_len "
                f"{self.max_seq_len}; ask for at most {self.max_seq_len - length} tokens"
            )
        top_k = int(inputs.scalar("runtime_top_k", row, 0) or 0)
        top_p = float(inputs.scalar("runtime_top_p", row, 0.0) or 0.0)
        if top_k == 0 and top_p == 0.0:
            top_k, top_p = 1, 1.0  # the C++ backend's default: greedy
        elif top_k == 0:
            top_k = self.vocab_size or 0
        if top_p <= 0.0:
            top_p = 1.0
        seed = inputs.scalar("seed", row, None)
        beam_width = int(inputs.scalar("beam_width", row, 1))
        if beam_width != 1:
            raise RequestError(f"beam_width {beam_width} is not supported by the cpu-reference runtime (beam width 1 "
                               "only); send beam_width 1, or serve an engine built with --max_beam_width on a GPU target")
        num_return = int(inputs.scalar("num_return_sequences", row, 1))
        if num_return != 1:
            raise RequestError(f"num_return_sequences {num_return} is not supported by the cpu-reference runtime; "
                               "send 1 (or several requests with different seeds)")
        end_id = inputs.scalar("end_id", row, None)
        return {
            "batch_index": row,
            "repetition_penalty": float(inputs.scalar("repetition_penalty", row, 1.0)),
            "presence_penalty": float(inputs.scalar("presence_penalty", row, 0.0)),
            "frequency_penalty": float(inputs.scalar("frequency_penalty", row, 0.0)),
            "min_tokens": int(inputs.scalar("min_tokens", row, 0)),
            "length_penalty": float(inputs.scalar("len_penalty", row, 1.0)),
            "return_log_probs": bool(inputs.scalar("return_log_probs", row, False)),
            "return_num_input_tokens": bool(inputs.scalar("return_num_input_tokens", row, False)),
            "return_num_output_tokens": bool(inputs.scalar("return_num_output_tokens", row, False)),
            "prompt": prompt,
            "max_new": max_new,
            "end_id": None if end_id is None else int(end_id),
            "temperature": float(inputs.scalar("temperature", row, 1.0)),
            "top_k": top_k,
            "top_p": top_p,
            "seed": None if seed is None else int(seed),
            "stop": inputs.words("stop_words_list", row),
            "bad": inputs.words("bad_words_list", row),
            "streaming": streaming,
            "exclude_input": bool(inputs.scalar("exclude_input_in_output", row, self.exclude_input_default)),
        }

    # --- responses -------------------------------------------------------------------------
    @staticmethod
    def _response(answer: Answer, p: dict, ids: list[int], logprobs: list[float], cum_logprob: float,
                  new_tokens: int):
        """One response holding `ids`; only the outputs the request asked for (fillTritonResponse)."""
        n = len(ids)
        tensors = {
            "output_ids": lambda: np.array(ids, dtype=np.int32).reshape(1, 1, n),
            "sequence_length": lambda: np.array([[n]], dtype=np.int32),
        }
        if p["return_log_probs"]:
            tensors["cum_log_probs"] = lambda: np.array([[cum_logprob]], dtype=np.float32)
            tensors["output_log_probs"] = lambda: np.array(logprobs, dtype=np.float32).reshape(1, 1, -1)
        if answer.batch > 1:
            tensors["batch_index"] = lambda: np.array([[p["batch_index"]]], dtype=np.int32)
        if p["return_num_input_tokens"]:
            tensors["num_input_tokens"] = lambda: np.array([[len(p["prompt"])]], dtype=np.int32)
        if p["return_num_output_tokens"]:
            tensors["num_output_tokens"] = lambda: np.array([[new_tokens]], dtype=np.int32)
        return pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor(name, make()) for name, make in tensors.items() if name in answer.requested])

    @staticmethod
    def _error(err: Exception):
        return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(f"tensorrt_llm: {err}"))

    # --- generation ------------------------------------------------------------------------
    def _tokens(self, p: dict):
        return self.model.generate(
            p["prompt"], max_new_tokens=p["max_new"], end_id=p["end_id"], temperature=p["temperature"],
            top_k=p["top_k"], top_p=p["top_p"], seed=p["seed"], stop_words_ids=p["stop"], bad_words_ids=p["bad"],
            repetition_penalty=p["repetition_penalty"], presence_penalty=p["presence_penalty"],
            frequency_penalty=p["frequency_penalty"], min_tokens=p["min_tokens"], length_penalty=p["length_penalty"],
        )

    def _generate(self, answer: Answer, p: dict, job: int) -> None:
        """Generate for one prompt and answer it: streamed token by token, or in one response."""
        ids: list[int] = []
        logprobs: list[float] = []
        try:
            with self.slots:
                for token in self._tokens(p):
                    if job in self.cancelled or answer.cancelled():
                        break  # cancelled: the request ends with what it has (finish reason "cancelled")
                    ids.append(int(token.token_id))
                    logprobs.append(float(token.logprob))
                    if p["streaming"]:
                        last = len(ids) == p["max_new"]
                        answer.send(self._response(answer, p, ids[-1:], logprobs[-1:], sum(logprobs), 1), last=last)
                        if last:
                            return
            if p["streaming"]:
                # Ended by the end token, a stop word or a cancel after its last token went out: the final
                # response carries no new token (the C++ backend's last streamed result can be empty the same way).
                answer.send(self._response(answer, p, [], [], sum(logprobs), 0), last=True)
                return
            shown = ids if p["exclude_input"] else [*p["prompt"], *ids]
            answer.send(self._response(answer, p, shown, logprobs, sum(logprobs), len(ids)), last=True)
        except Exception as err:  # every failure is this prompt's answer, never a dead stub
            answer.send(self._error(err), last=True)

    def _stop(self, request, sender) -> None:
        """`stop`: cancel the in-flight generations of this request id; an empty final response says it is done."""
        request_id = request.request_id()
        if not request_id:
            sender.send(self._error(RequestError("Trying to stop a request but request ID is not provided")),
                        flags=FINAL)
            return
        with self.lock:
            self.cancelled.update(self.running.get(request_id, set()))
        sender.send(pb_utils.InferenceResponse(output_tensors=[]), flags=FINAL)

    def _start(self, request) -> None:
        sender = request.get_response_sender()
        if _stop_flag(request):
            self._stop(request, sender)
            return
        try:
            prompts = self._prompts(request)
            requested = set(request.requested_output_names())
            missing = [name for name in REQUIRED_OUTPUTS if name not in requested]
            if missing:
                raise RequestError(f"{missing[0]} tensor must be present in list of output tensors")
        except Exception as err:
            sender.send(self._error(err), flags=FINAL)
            return
        answer = Answer(sender, len(prompts), requested, len(prompts))
        request_id = request.request_id()
        with self.lock:
            jobs = list(range(self.next_job, self.next_job + len(prompts)))
            self.next_job += len(prompts)
            if request_id:
                self.running.setdefault(request_id, set()).update(jobs)
        for p, job in zip(prompts, jobs):
            thread = threading.Thread(target=self._work, args=(answer, p, job, request_id),
                                      name="trtpipe-generate", daemon=True)
            with self.lock:
                self.threads.add(thread)
            thread.start()

    def _work(self, answer: Answer, p: dict, job: int, request_id: str) -> None:
        try:
            self._generate(answer, p, job)
        finally:
            with self.lock:
                self.threads.discard(threading.current_thread())
                self.cancelled.discard(job)  # the stop is spent; a later request may reuse the id
                if request_id in self.running:
                    self.running[request_id].discard(job)
                    if not self.running[request_id]:
                        del self.running[request_id]

    def execute(self, requests):
        for request in requests:
            self._start(request)
        return None

    def finalize(self):
        with self.lock:
            threads = list(self.threads)
        for thread in threads:
            thread.join(timeout=5)


def _stop_flag(request) -> bool:
    tensor = pb_utils.get_input_tensor_by_name(request, "stop")
    return tensor is not None and tensor.as_numpy().size > 0 and bool(tensor.as_numpy().reshape(-1)[0])
