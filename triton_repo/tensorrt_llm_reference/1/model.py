"""trtpipe tensorrt_llm model for the cpu-reference target (Triton Python backend).

Serves a reference engine (TRT-LLM checkpoint + engine config.json) through
`trtpipe.reference.runtime.ReferenceModel` behind the inputs and outputs of the TensorRT-LLM
C++ backend, so the ensemble, BLS, streaming and clients are exercised for real on a CPU.
Semantics follow the C++ backend: streaming responses carry only the new token; a non-streaming
response carries the prompt too unless exclude_input_in_output; runtime_top_k = runtime_top_p = 0
means greedy; stop sequences are included in the output.

Every input of the upstream contract is declared (config.pbtxt). Honoured: the sampling inputs (temperature,
top-k/p, seed, repetition / presence / frequency penalties, min_tokens), stop and bad words, end and pad ids,
beam_width 1 (other widths are refused), len_penalty / early_stopping / beam_search_diversity_rate (beam-search
settings: accepted, no effect at beam width 1), num_return_sequences 1, return_log_probs,
return_num_input_tokens / return_num_output_tokens, streaming, `stop` (cancels the in-flight request with the
same request id, as the C++ backend does) and the KV-cache retention hints (cache eviction priorities: no effect
on results, ignored). Everything else (LoRA, prompt tables, encoder-decoder, draft tokens, guided decoding,
lookahead, multimodal, embedding bias, top-p decay, logits and perf-metric outputs) is refused with a one-line
error naming the input when a request carries it.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils


def _param(model_config: dict, key: str, default: str = "") -> str:
    return model_config.get("parameters", {}).get(key, {}).get("string_value", default)


def _scalar(request, name: str, default=None):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    return tensor.as_numpy().reshape(-1)[0].item()


def words_from_list(tensor) -> list[list[int]]:
    """The [1, 2, L] stop/bad words tensor -> a list of token-id sequences."""
    if tensor is None:
        return []
    array = tensor.as_numpy().reshape(-1, 2, tensor.as_numpy().shape[-1])[0]
    ids, ends = array[0].tolist(), [e for e in array[1].tolist() if e >= 0]
    words, start = [], 0
    for end in ends:
        if end > start:
            words.append(ids[start:end])
        start = end
    return words


class RequestError(ValueError):
    """A request the engine refuses (too long, malformed): reported to the client."""


# Inputs the reference runtime cannot honour: a request that carries one (non-empty) is refused, naming it.
UNSUPPORTED_INPUTS = {
    "encoder_input_features": "encoder-decoder models",
    "encoder_output_lengths": "encoder-decoder models",
    "decoder_input_ids": "encoder-decoder models",
    "decoder_input_lengths": "encoder-decoder models",
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


def _carries(tensor) -> bool:
    """A tensor that is present and holds something (preprocessing may send empty placeholders)."""
    if tensor is None:
        return False
    array = tensor.as_numpy()
    if array.size == 0:
        return False
    if array.dtype == np.float32 and not np.any(array):
        return False  # an all-zero embedding bias changes nothing
    return True


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
        # At most max_batch_size requests generate at once, like the in-flight batcher's slots.
        self.slots = threading.BoundedSemaphore(max(1, int(self.model_config.get("max_batch_size", 1))))
        self.threads: set[threading.Thread] = set()
        self.lock = threading.Lock()
        self.cancelled: set[str] = set()  # request ids a `stop` request has cancelled

    # --- request parsing -------------------------------------------------------------------
    def _refuse_unsupported(self, request) -> None:
        for name, feature in UNSUPPORTED_INPUTS.items():
            if _carries(pb_utils.get_input_tensor_by_name(request, name)):
                raise RequestError(f"input {name} ({feature}) is not supported by the cpu-reference runtime; "
                                   "omit it, or serve a TensorRT engine on a GPU target")
        for name, output in UNSUPPORTED_SWITCHES.items():
            if bool(_scalar(request, name, False)):
                raise RequestError(f"{name}: the cpu-reference runtime does not return {output}; send {name}=false")

    def _parse(self, request) -> dict:
        self._refuse_unsupported(request)
        ids_tensor = pb_utils.get_input_tensor_by_name(request, "input_ids")
        if ids_tensor is None:
            raise RequestError("input_ids is missing: the cpu-reference runtime needs the prompt's token ids "
                               "(upstream leaves it optional only for encoder-decoder and prompt-table requests)")
        input_ids = ids_tensor.as_numpy()
        input_ids = input_ids.reshape(-1, input_ids.shape[-1])
        if input_ids.shape[0] != 1:
            raise RequestError(f"batch of {input_ids.shape[0]} in one request; send one prompt per request")
        length = int(_scalar(request, "input_lengths", input_ids.shape[-1]))
        prompt = input_ids[0, :length].astype(np.int64).tolist()
        max_new = int(_scalar(request, "request_output_len"))
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
        top_k = int(_scalar(request, "runtime_top_k", 0) or 0)
        top_p = float(_scalar(request, "runtime_top_p", 0.0) or 0.0)
        if top_k == 0 and top_p == 0.0:
            top_k, top_p = 1, 1.0  # the C++ backend's default: greedy
        elif top_k == 0:
            top_k = self.vocab_size or 0
        if top_p <= 0.0:
            top_p = 1.0
        seed = _scalar(request, "seed", None)
        beam_width = int(_scalar(request, "beam_width", 1))
        if beam_width != 1:
            raise RequestError(f"beam_width {beam_width} is not supported by the cpu-reference runtime (beam width 1 "
                               "only); send beam_width 1, or serve an engine built with --max_beam_width on a GPU target")
        num_return = int(_scalar(request, "num_return_sequences", 1))
        if num_return != 1:
            raise RequestError(f"num_return_sequences {num_return} is not supported by the cpu-reference runtime; "
                               "send 1 (or several requests with different seeds)")
        return {
            "request_id": request.request_id(),
            "repetition_penalty": float(_scalar(request, "repetition_penalty", 1.0)),
            "presence_penalty": float(_scalar(request, "presence_penalty", 0.0)),
            "frequency_penalty": float(_scalar(request, "frequency_penalty", 0.0)),
            "min_tokens": int(_scalar(request, "min_tokens", 0)),
            "length_penalty": float(_scalar(request, "len_penalty", 1.0)),
            "return_num_input_tokens": bool(_scalar(request, "return_num_input_tokens", False)),
            "return_num_output_tokens": bool(_scalar(request, "return_num_output_tokens", False)),
            "prompt": prompt,
            "max_new": max_new,
            "end_id": _scalar(request, "end_id", None),
            "pad_id": int(_scalar(request, "pad_id", 0) or 0),
            "temperature": float(_scalar(request, "temperature", 1.0)),
            "top_k": top_k,
            "top_p": top_p,
            "seed": None if seed is None else int(seed),
            "stop": words_from_list(pb_utils.get_input_tensor_by_name(request, "stop_words_list")),
            "bad": words_from_list(pb_utils.get_input_tensor_by_name(request, "bad_words_list")),
            "streaming": bool(_scalar(request, "streaming", False)),
            "exclude_input": bool(_scalar(request, "exclude_input_in_output", self.exclude_input_default)),
        }

    def _tokens(self, p: dict):
        return self.model.generate(
            p["prompt"],
            max_new_tokens=p["max_new"],
            end_id=None if p["end_id"] is None else int(p["end_id"]),
            temperature=p["temperature"],
            top_k=p["top_k"],
            top_p=p["top_p"],
            seed=p["seed"],
            stop_words_ids=p["stop"],
            bad_words_ids=p["bad"],
            repetition_penalty=p["repetition_penalty"],
            presence_penalty=p["presence_penalty"],
            frequency_penalty=p["frequency_penalty"],
            min_tokens=p["min_tokens"],
            length_penalty=p["length_penalty"],
        )

    @staticmethod
    def _response(ids: list[int], logprobs: list[float], p: dict, new_tokens: int):
        """One response; `new_tokens` is how many generated tokens it reports (num_output_tokens)."""
        n = len(ids)
        tensors = [
            pb_utils.Tensor("output_ids", np.array(ids, dtype=np.int32).reshape(1, 1, n)),
            pb_utils.Tensor("sequence_length", np.array([[n]], dtype=np.int32)),
            pb_utils.Tensor("cum_log_probs", np.array([[sum(logprobs)]], dtype=np.float32)),
            pb_utils.Tensor("output_log_probs", np.array(logprobs, dtype=np.float32).reshape(1, 1, -1)),
            pb_utils.Tensor("batch_index", np.array([[0]], dtype=np.int32)),
            pb_utils.Tensor("sequence_index", np.array([[0]], dtype=np.int32)),
        ]
        if p["return_num_input_tokens"]:
            tensors.append(pb_utils.Tensor("num_input_tokens", np.array([[len(p["prompt"])]], dtype=np.int32)))
        if p["return_num_output_tokens"]:
            tensors.append(pb_utils.Tensor("num_output_tokens", np.array([[new_tokens]], dtype=np.int32)))
        return pb_utils.InferenceResponse(output_tensors=tensors)

    @staticmethod
    def _error(err: Exception):
        return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(f"tensorrt_llm: {err}"))

    # --- generation ------------------------------------------------------------------------
    def _run(self, request, sender=None):
        """Generate for one request; with `sender` (decoupled) stream and close it, else return a response."""
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        if bool(_scalar(request, "stop", False)):
            # The C++ backend treats stop=true as "cancel the request with this id": so do we.
            with self.lock:
                self.cancelled.add(request.request_id())
            if sender is None:
                return pb_utils.InferenceResponse(output_tensors=[])
            sender.send(flags=final)
            return None
        try:
            p = self._parse(request)
            if sender is None and p["streaming"]:
                raise RequestError(
                    "streaming is only supported when the model is deployed in decoupled mode; "
                    "publish with triton.streaming: true or send stream=false"
                )
            ids: list[int] = []
            logprobs: list[float] = []
            with self.slots:
                try:
                    for token in self._tokens(p):
                        if sender is not None and getattr(sender, "is_cancelled", lambda: False)():
                            break
                        if p["request_id"] and p["request_id"] in self.cancelled:
                            break
                        ids.append(int(token.token_id))
                        logprobs.append(float(token.logprob))
                        if sender is not None and p["streaming"]:
                            sender.send(self._response([ids[-1]], [logprobs[-1]], p, 1))
                finally:
                    with self.lock:
                        self.cancelled.discard(p["request_id"])  # the stop is spent; a later request may reuse the id
            if sender is not None and p["streaming"]:
                sender.send(flags=final)
                return None
            out = ids if p["exclude_input"] else [*p["prompt"], *ids]
            out_logprobs = logprobs if p["exclude_input"] else [0.0] * len(p["prompt"]) + logprobs
            response = self._response(out, out_logprobs, p, len(ids))
        except Exception as err:
            response = self._error(err)
        if sender is None:
            return response
        sender.send(response, flags=final)
        return None

    def _run_in_thread(self, request):
        sender = request.get_response_sender()

        def work():
            try:
                self._run(request, sender)
            finally:
                with self.lock:
                    self.threads.discard(threading.current_thread())

        thread = threading.Thread(target=work, name="trtpipe-generate", daemon=True)
        with self.lock:
            self.threads.add(thread)
        thread.start()

    def execute(self, requests):
        if self.decoupled:
            for request in requests:
                self._run_in_thread(request)
            return None
        return [self._run(request) for request in requests]

    def finalize(self):
        with self.lock:
            threads = list(self.threads)
        for thread in threads:
            thread.join(timeout=5)
