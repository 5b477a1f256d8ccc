"""trtpipe llmapi tensorrt_llm for the cpu-reference target (Triton Python backend).

The same config.pbtxt and model.yaml as the GPU llmapi repository, with trtpipe's CPU reference runtime behind
them instead of tensorrt_llm.LLM: it loads the Hugging Face-format checkpoint model.yaml's `model` names
(`trtpipe.reference.hf_loader`) and answers requests the way upstream's llmapi model does (facts and sources in
build_configs/triton_contracts/llmapi.yaml, `layout`):
- text_input is a 1-D string tensor; its first element is the prompt, tokenized with the checkpoint's tokenizer
  and its special tokens (the LLM API's default add_special_tokens=True).
- sampling_param_* become SamplingParams: greedy when temperature, top_p and top_k are all unset, or top_k == 1,
  top_p == 0 or temperature == 0 (tensorrt_llm/sampling_params.py params_imply_greedy_decoding); otherwise
  temperature defaults to 1, top_k to the whole vocabulary, top_p to 1. max_tokens unset: max_seq_len minus the
  prompt (executor base_worker _deduce_max_tokens). Stop strings end the text and are cut from it, with
  finish_reason "stop" and stop_reason the string.
- text_output is the cumulative text (CompletionOutput.text), decoded without special tokens; a non-streaming answer
  begins with the prompt unless sampling_param_exclude_input_from_output (default false, upstream helpers.py), a
  streamed one never does (the executor sends a stream only the generated tokens).
- finish_reason, stop_reason and cumulative_logprob are sent as strings when asked for (return_*).
- streaming needs the decoupled deployment ("Streaming is only supported in decoupled mode.").
- `stop` cancels the in-flight request with the same request id and is answered with a CANCELLED error.
- kv_cache_config.max_attention_window (model.yaml) sets each layer's attention window.
- Without chunked prefill a prompt longer than max_num_tokens is refused (llmapi/llm.py _check_arguments).
Refused with a one-line error naming the input: image_url (multimodal), lora_* (LoRA adapters), best_of != 1,
sampling_param_return_perf_metrics (no KV-cache blocks or scheduler timings on this runtime).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils
import yaml

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
UNSUPPORTED_INPUTS = {
    "image_url": "multimodal inputs",
    "lora_id": "LoRA adapters",
    "lora_name": "LoRA adapters",
    "lora_path": "LoRA adapters",
    "lora_ckpt_source": "LoRA adapters",
}


class RequestError(ValueError):
    """A request this model refuses: reported to the client as the response's error."""


def _scalar(request, name: str, default=None):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    array = tensor.as_numpy()
    if array.size != 1:
        raise RequestError(f"Expected a scalar tensor for tensor {name}")
    return array.reshape(-1)[0].item()


def _strings(request, name: str) -> list[str]:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return []
    out = []
    for value in tensor.as_numpy().reshape(-1):
        out.append(value.decode("utf-8") if isinstance(value, bytes) else str(value))
    return out


class TritonPythonModel:
    def initialize(self, args):
        from tokenizers import Tokenizer

        from trtpipe.reference.hf_loader import hf_end_id
        from trtpipe.reference.runtime import ReferenceModel  # the venv's trtpipe (editable install)

        self.model_config = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(self.model_config)
        version_dir = Path(args["model_repository"]) / str(args["model_version"])
        settings = yaml.safe_load((version_dir / os.environ.get("LLM_CONFIG_PATH", "model.yaml")).read_text())
        triton_config = settings.pop("triton_config")
        if bool(triton_config["decoupled"]) != self.decoupled:
            raise pb_utils.TritonModelException(
                f"model.yaml triton_config.decoupled is {triton_config['decoupled']} but config.pbtxt says "
                f"decoupled {self.decoupled}; publish the repository again")
        model_dir = Path(settings["model"])
        self.model_dir = model_dir if model_dir.is_absolute() else version_dir / model_dir
        self.model = ReferenceModel.load(self.model_dir)
        self.tokenizer = Tokenizer.from_file(str(self.model_dir / "tokenizer.json"))
        self.end_id = hf_end_id(self.model_dir)
        self.max_seq_len = int(settings.get("max_seq_len") or json.loads(
            (self.model_dir / "config.json").read_text()).get("max_position_embeddings"))
        # The KV cache's attention window per layer, as the LLM takes it (kv_cache_config.max_attention_window).
        window = (settings.get("kv_cache_config") or {}).get("max_attention_window")
        if window:
            self.model.set_attention_windows([int(w) for w in window])
        self.max_num_tokens = settings.get("max_num_tokens")
        self.chunked_prefill = bool(settings.get("enable_chunked_prefill", False))
        # At most max_batch_size requests generate at once, like the LLM's scheduler slots.
        self.slots = threading.BoundedSemaphore(max(1, int(settings.get("max_batch_size") or 1)))
        self.lock = threading.Lock()
        self.running: dict[str, set[int]] = {}  # client request id -> ids of our in-flight generations
        self.cancelled: set[int] = set()
        self.threads: set[threading.Thread] = set()
        self.next_id = 0

    # --- request parsing -------------------------------------------------------------------
    def _parse(self, request) -> dict:
        for name, feature in UNSUPPORTED_INPUTS.items():
            if pb_utils.get_input_tensor_by_name(request, name) is not None:
                raise RequestError(f"input {name} ({feature}) is not supported by the cpu-reference runtime; omit it, "
                                   "or serve on a GPU target")
        if bool(_scalar(request, "sampling_param_return_perf_metrics", False)):
            raise RequestError("sampling_param_return_perf_metrics: the cpu-reference runtime has no KV-cache blocks "
                               "or scheduler timings to report; send false")
        best_of = _scalar(request, "sampling_param_best_of", 1)
        if int(best_of) != 1:
            raise RequestError(f"sampling_param_best_of {best_of} is not supported by the cpu-reference runtime; send 1")
        text = pb_utils.get_input_tensor_by_name(request, "text_input")
        if text is None:
            raise RequestError("text_input is missing from the request")
        array = text.as_numpy()
        if len(array.shape) > 1:
            raise RequestError("The current implementation only supports text_input being a 1D tensor.")
        prompt = array[0].decode("utf-8") if isinstance(array[0], bytes) else str(array[0])
        ids = self.tokenizer.encode(prompt, add_special_tokens=True).ids
        if not ids:
            raise RequestError("text_input tokenizes to no tokens")
        if not self.chunked_prefill and self.max_num_tokens and len(ids) > int(self.max_num_tokens):
            raise RequestError(f"The sum of prompt length ({float(len(ids))}), query length (0) should not exceed "
                               f"max_num_tokens ({self.max_num_tokens})")
        max_tokens = _scalar(request, "sampling_param_max_tokens", None)
        if max_tokens is None:
            max_tokens = self.max_seq_len - len(ids)
            if max_tokens < 1:
                raise RequestError(f"prompt length {len(ids)} leaves no room below max_seq_len {self.max_seq_len}")
        max_tokens = int(max_tokens)
        if max_tokens < 1:
            raise RequestError(f"sampling_param_max_tokens {max_tokens} must be at least 1")
        if len(ids) + max_tokens > self.max_seq_len:
            raise RequestError(f"prompt length {len(ids)} + sampling_param_max_tokens {max_tokens} exceeds max_seq_len "
                               f"{self.max_seq_len}; ask for at most {self.max_seq_len - len(ids)} tokens")
        temperature = _scalar(request, "sampling_param_temperature", None)
        top_k = _scalar(request, "sampling_param_top_k", None)
        top_p = _scalar(request, "sampling_param_top_p", None)
        greedy = (temperature is None and top_p is None and top_k is None) or top_k == 1 or top_p == 0.0 \
            or temperature == 0
        stops = [s for s in _strings(request, "sampling_param_stop") if s]
        seed = _scalar(request, "sampling_param_seed", None)
        return {
            "request_id": request.request_id(),
            "prompt_ids": ids,
            "max_tokens": max_tokens,
            "temperature": 1.0 if greedy or temperature is None else float(temperature),
            "top_k": 1 if greedy else int(top_k or 0) or self.model.config.vocab_size,
            "top_p": 1.0 if greedy or top_p is None else float(top_p),
            "seed": None if seed is None else int(seed),
            "presence_penalty": float(_scalar(request, "sampling_param_presence_penalty", 0.0)),
            "frequency_penalty": float(_scalar(request, "sampling_param_frequency_penalty", 0.0)),
            "stops": [(s, self.tokenizer.encode(s, add_special_tokens=False).ids) for s in stops],
            "exclude_input": bool(_scalar(request, "sampling_param_exclude_input_from_output", False)),
            "streaming": bool(_scalar(request, "streaming", False)),
            "return_finish_reason": bool(_scalar(request, "return_finish_reason", False)),
            "return_stop_reason": bool(_scalar(request, "return_stop_reason", False)),
            "return_cumulative_logprob": bool(_scalar(request, "return_cumulative_logprob", False)),
        }

    # --- responses -------------------------------------------------------------------------
    def _response(self, p: dict, ids: list[int], logprob: float, finish: str | None, stop_reason: str | None):
        # The prompt is echoed only in a non-streaming answer: upstream's helpers.py defaults
        # sampling_param_exclude_input_from_output to false, and the executor puts the prompt's tokens in a result only
        # when not streaming (TensorRT-LLM cpp/tensorrt_llm/batch_manager/llmRequest.cpp createResult, code index
        # 89fd9b74); CompletionOutput.text is decoded from those tokens (tensorrt_llm/executor/result.py).
        shown = ids if p["exclude_input"] or p["streaming"] else [*p["prompt_ids"], *ids]
        text = self.tokenizer.decode(shown, skip_special_tokens=True)
        tensors = [pb_utils.Tensor("text_output", np.array([text.encode("utf-8")], dtype=np.object_))]
        for switch, name, value in (("return_finish_reason", "finish_reason", finish),
                                    ("return_stop_reason", "stop_reason", stop_reason),
                                    ("return_cumulative_logprob", "cumulative_logprob", logprob)):
            if p[switch]:
                tensors.append(pb_utils.Tensor(name, np.array([str(value).encode("utf-8")], dtype=np.object_)))
        return pb_utils.InferenceResponse(output_tensors=tensors)

    @staticmethod
    def _error(message: str, code=None):
        error = pb_utils.TritonError(message) if code is None else pb_utils.TritonError(message, code)
        return pb_utils.InferenceResponse(output_tensors=[], error=error)

    # --- generation ------------------------------------------------------------------------
    def _generate(self, request, sender, p: dict, job: int) -> None:
        ids: list[int] = []
        logprob = 0.0
        finish, stop_reason = "length", None
        stop_ids = [ids_ for _, ids_ in p["stops"] if ids_]
        for token in self.model.generate(
            p["prompt_ids"], max_new_tokens=p["max_tokens"], end_id=self.end_id, temperature=p["temperature"],
            top_k=p["top_k"], top_p=p["top_p"], seed=p["seed"], stop_words_ids=stop_ids,
            presence_penalty=p["presence_penalty"], frequency_penalty=p["frequency_penalty"],
        ):
            if job in self.cancelled or getattr(request, "is_cancelled", lambda: False)():
                sender.send(self._error("Request cancelled by client", pb_utils.TritonError.CANCELLED), flags=FINAL)
                return
            ids.append(int(token.token_id))
            logprob += float(token.logprob)
            matched = next(((s, w) for s, w in p["stops"] if w and ids[-len(w):] == w), None)
            if matched is not None:  # the stop string is not part of the output (include_stop_str_in_output false)
                del ids[-len(matched[1]):]
                finish, stop_reason = "stop", matched[0]
                break
            if p["streaming"] and len(ids) < p["max_tokens"]:
                sender.send(self._response(p, ids, logprob, None, None))
        else:
            if len(ids) < p["max_tokens"]:
                finish = "stop"  # the end token
        sender.send(self._response(p, ids, logprob, finish, stop_reason), flags=FINAL)

    def _stop(self, request, sender) -> None:
        """`stop`: cancel the in-flight generations of this request id (upstream handle_stop_request)."""
        user_id = request.request_id()
        if not user_id:
            sender.send(self._error("A request id must be provided for request cancellation"), flags=FINAL)
            return
        with self.lock:
            self.cancelled.update(self.running.get(user_id, set()))
        sender.send(self._error("Request cancelled by client", pb_utils.TritonError.CANCELLED), flags=FINAL)

    def _run(self, request, sender) -> None:
        if bool(_scalar(request, "stop", False)):
            self._stop(request, sender)
            return
        with self.lock:
            job, self.next_id = self.next_id, self.next_id + 1
            user_id = request.request_id()
            if user_id:
                self.running.setdefault(user_id, set()).add(job)
        try:
            p = self._parse(request)
            if p["streaming"] and not self.decoupled:
                raise RequestError("Streaming is only supported in decoupled mode.")
            with self.slots:
                self._generate(request, sender, p, job)
        except Exception as err:  # every failure is the request's answer, never a dead stub
            sender.send(self._error(f"Error generating request: {err}"), flags=FINAL)
        finally:
            with self.lock:
                self.cancelled.discard(job)
                if user_id and user_id in self.running:
                    self.running[user_id].discard(job)
                    if not self.running[user_id]:
                        del self.running[user_id]

    def execute(self, requests):
        # Like upstream, every request is answered through its response sender from a worker, so a slow
        # generation never holds the others up (decoupled or not).
        for request in requests:
            sender = request.get_response_sender()

            def work(request=request, sender=sender):
                try:
                    self._run(request, sender)
                finally:
                    with self.lock:
                        self.threads.discard(threading.current_thread())

            thread = threading.Thread(target=work, name="trtpipe-llmapi", daemon=True)
            with self.lock:
                self.threads.add(thread)
            thread.start()
        return None

    def finalize(self):
        with self.lock:
            threads = list(self.threads)
        for thread in threads:
            thread.join(timeout=5)
