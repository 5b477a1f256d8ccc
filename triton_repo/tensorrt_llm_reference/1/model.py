"""trtpipe tensorrt_llm model for the cpu-reference target (Triton Python backend).

Serves a reference engine (TRT-LLM checkpoint + engine config.json) through
`trtpipe.reference.runtime.ReferenceModel` behind the inputs and outputs of the TensorRT-LLM
C++ backend, so the ensemble, BLS, streaming and clients are exercised for real on a CPU.
Semantics follow the C++ backend: streaming responses carry only the new token; a non-streaming
response carries the prompt too unless exclude_input_in_output; runtime_top_k = runtime_top_p = 0
means greedy; stop sequences are included in the output.
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


class TritonPythonModel:
    def initialize(self, args):
        from trtpipe.reference.runtime import ReferenceModel  # the venv's trtpipe (editable install)

        self.model_config = json.loads(args["model_config"])
        model_dir = Path(args["model_repository"])
        engine_dir = Path(_param(self.model_config, "gpt_model_path", "1"))
        if not engine_dir.is_absolute():
            engine_dir = model_dir / engine_dir
        engine_config = json.loads((engine_dir / "config.json").read_text())
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

    # --- request parsing -------------------------------------------------------------------
    def _parse(self, request) -> dict:
        input_ids = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy()
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
        return {
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
        )

    @staticmethod
    def _response(ids: list[int], logprobs: list[float]):
        n = len(ids)
        return pb_utils.InferenceResponse(
            output_tensors=[
                pb_utils.Tensor("output_ids", np.array(ids, dtype=np.int32).reshape(1, 1, n)),
                pb_utils.Tensor("sequence_length", np.array([[n]], dtype=np.int32)),
                pb_utils.Tensor("cum_log_probs", np.array([[sum(logprobs)]], dtype=np.float32)),
                pb_utils.Tensor("output_log_probs", np.array(logprobs, dtype=np.float32).reshape(1, 1, -1)),
            ]
        )

    @staticmethod
    def _error(err: Exception):
        return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(f"tensorrt_llm: {err}"))

    # --- generation ------------------------------------------------------------------------
    def _run(self, request, sender=None):
        """Generate for one request; with `sender` (decoupled) stream and close it, else return a response."""
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
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
                for token in self._tokens(p):
                    if sender is not None and getattr(sender, "is_cancelled", lambda: False)():
                        break
                    ids.append(int(token.token_id))
                    logprobs.append(float(token.logprob))
                    if sender is not None and p["streaming"]:
                        sender.send(self._response([ids[-1]], [logprobs[-1]]))
            if sender is not None and p["streaming"]:
                sender.send(flags=final)
                return None
            out = ids if p["exclude_input"] else [*p["prompt"], *ids]
            out_logprobs = logprobs if p["exclude_input"] else [0.0] * len(p["prompt"]) + logprobs
            response = self._response(out, out_logprobs)
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
