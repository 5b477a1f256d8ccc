"""trtpipe tensorrt_llm_bls model (Triton Python backend; decoupled when the deployment streams).

One model that calls `preprocessing` and then `tensorrt_llm` through BLS and detokenizes
incrementally: each streamed text delta is exact (a character split across tokens is held back
until complete), and the deltas concatenate to the non-streaming text. No torch.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils
from tokenizers import Tokenizer

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL

# BLS input name -> preprocessing input name
PRE_INPUTS = {
    "text_input": "QUERY",
    "decoder_text_input": "DECODER_QUERY",
    "image_bytes_input": "IMAGE_BYTES",
    "image_url_input": "IMAGE_URL",
    "image_sizes_input": "IMAGE_SIZES",
    "video_bytes_input": "VIDEO_BYTES",
    "max_tokens": "REQUEST_OUTPUT_LEN",
    "bad_words": "BAD_WORDS_DICT",
    "stop_words": "STOP_WORDS_DICT",
    "embedding_bias_words": "EMBEDDING_BIAS_WORDS",
    "embedding_bias_weights": "EMBEDDING_BIAS_WEIGHTS",
    "end_id": "END_ID",
    "pad_id": "PAD_ID",
    "prompt_table_extra_id": "PROMPT_TABLE_EXTRA_ID",
}
# BLS inputs with no destination here (a preprocessed image, a draft model): refused when a request carries them.
UNSUPPORTED_INPUTS = {
    "image_input": "preprocessed images (multimodal models)",
    "num_draft_tokens": "a draft model (speculative decoding)",
    "use_draft_logits": "a draft model (speculative decoding)",
}
# preprocessing output -> tensorrt_llm input
PRE_TO_LLM = {
    "INPUT_ID": "input_ids",
    "REQUEST_INPUT_LEN": "input_lengths",
    "REQUEST_OUTPUT_LEN": "request_output_len",
    "STOP_WORDS_IDS": "stop_words_list",
    "BAD_WORDS_IDS": "bad_words_list",
    "OUT_END_ID": "end_id",
    "OUT_PAD_ID": "pad_id",
}
# BLS input name -> tensorrt_llm input name (passed through as given)
PASS_THROUGH = {
    "top_k": "runtime_top_k",
    "top_p": "runtime_top_p",
    "temperature": "temperature",
    "length_penalty": "len_penalty",
    "repetition_penalty": "repetition_penalty",
    "min_tokens": "min_tokens",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "seed": "seed",
    "beam_width": "beam_width",
    "num_return_sequences": "num_return_sequences",
    "return_log_probs": "return_log_probs",
    "return_context_logits": "return_context_logits",
    "return_generation_logits": "return_generation_logits",
    "return_perf_metrics": "return_perf_metrics",
    "return_num_input_tokens": "return_num_input_tokens",
    "return_num_output_tokens": "return_num_output_tokens",
    "exclude_input_in_output": "exclude_input_in_output",
    "stream": "streaming",
    "prompt_embedding_table": "prompt_embedding_table",
    "prompt_vocab_size": "prompt_vocab_size",
    "lora_task_id": "lora_task_id",
    "lora_weights": "lora_weights",
    "lora_config": "lora_config",
    "guided_decoding_guide_type": "guided_decoding_guide_type",
    "guided_decoding_guide": "guided_decoding_guide",
}
LLM_OUTPUTS = ["output_ids", "sequence_length", "cum_log_probs", "output_log_probs"]
# tensorrt_llm outputs passed on to the client as they are, when tensorrt_llm returns them.
LLM_EXTRA_OUTPUTS = ["batch_index", "sequence_index", "num_input_tokens", "num_output_tokens", "context_logits",
                     "generation_logits", "kv_cache_alloc_new_blocks", "kv_cache_reused_blocks",
                     "kv_cache_alloc_total_blocks", "arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns",
                     "last_token_time_ns", "acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens"]


def _param(model_config: dict, key: str, default: str = "") -> str:
    return model_config.get("parameters", {}).get(key, {}).get("string_value", default)


class IncrementalDetokenizer:
    """Text deltas for a growing token list; holds back an incomplete UTF-8 character."""

    def __init__(self, tokenizer: Tokenizer, anchor: int, skip_special_tokens: bool) -> None:
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens
        # The anchor token keeps a word-initial token's leading space (see postprocessing).
        self.ids = [anchor]
        self.prefix_offset = 0
        self.read_offset = 1

    def add(self, new_ids: list[int]) -> str:
        self.ids.extend(new_ids)
        prefix = self.tokenizer.decode(self.ids[self.prefix_offset : self.read_offset], skip_special_tokens=self.skip)
        text = self.tokenizer.decode(self.ids[self.prefix_offset :], skip_special_tokens=self.skip)
        if text.endswith("\ufffd") or len(text) <= len(prefix):
            return ""
        delta = text[len(prefix) :] if text.startswith(prefix) else ""
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)
        return delta

    def flush(self) -> str:
        """What add() held back (an incomplete character at the end), decoded as it is."""
        if self.read_offset == len(self.ids):
            return ""
        prefix = self.tokenizer.decode(self.ids[self.prefix_offset : self.read_offset], skip_special_tokens=self.skip)
        text = self.tokenizer.decode(self.ids[self.prefix_offset :], skip_special_tokens=self.skip)
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)
        return text[len(prefix) :] if text.startswith(prefix) else text


def anchor_id(tokenizer: Tokenizer) -> int:
    for text in ("a", "the", "x", "0"):
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        if len(ids) == 1:
            return ids[0]
    return 0


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = json.loads(args["model_config"])
        model_dir = Path(args["model_repository"])
        tok_dir = model_dir / _param(self.model_config, "tokenizer_dir", "tokenizer")
        self.tokenizer = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
        self.anchor = anchor_id(self.tokenizer)
        self.llm_name = _param(self.model_config, "tensorrt_llm_model_name", "tensorrt_llm")
        self.llm_decoupled = _param(self.model_config, "tensorrt_llm_decoupled", "true") == "true"
        # Decoupled only when the deployment streams (config.pbtxt decoupled: ${decoupled_mode}, as upstream's).
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(self.model_config)
        self.threads: set[threading.Thread] = set()
        self.lock = threading.Lock()

    def _preprocess(self, request) -> dict[str, pb_utils.Tensor]:
        for name, feature in UNSUPPORTED_INPUTS.items():
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is not None and tensor.as_numpy().size:
                raise ValueError(f"input {name} ({feature}) is not supported by trtpipe's BLS model; omit it")
        tensors = []
        for name, pre_name in PRE_INPUTS.items():
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is not None:
                tensors.append(pb_utils.Tensor(pre_name, tensor.as_numpy()))
        response = pb_utils.InferenceRequest(
            model_name="preprocessing", requested_output_names=list(PRE_TO_LLM), inputs=tensors
        ).exec()
        if response.has_error():
            raise RuntimeError(response.error().message())
        return {
            llm_name: pb_utils.Tensor(llm_name, pb_utils.get_output_tensor_by_name(response, pre_name).as_numpy())
            for pre_name, llm_name in PRE_TO_LLM.items()
        }

    def _llm_responses(self, request, llm_inputs: dict[str, pb_utils.Tensor], wanted: list[str]):
        for name, llm_name in PASS_THROUGH.items():
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is not None:
                llm_inputs[llm_name] = pb_utils.Tensor(llm_name, tensor.as_numpy())
        llm_request = pb_utils.InferenceRequest(
            model_name=self.llm_name, requested_output_names=wanted, inputs=list(llm_inputs.values()),
            request_id=request.request_id(),
        )
        if self.llm_decoupled:
            yield from llm_request.exec(decoupled=True)
        else:
            yield llm_request.exec()

    def _run(self, request, sender) -> None:
        """Answer one request: a text delta per tensorrt_llm response when streaming, else one text per prompt."""
        try:
            stream_tensor = pb_utils.get_input_tensor_by_name(request, "stream")
            streaming = bool(stream_tensor.as_numpy().reshape(-1)[0]) if stream_tensor is not None else False
            if streaming and not self.decoupled:
                raise ValueError("streaming is only supported when the model is deployed in decoupled mode; "
                                 "publish with triton.streaming: true, or send stream=false")
            requested = set(request.requested_output_names())
            # Ask tensorrt_llm for what the client asked for (upstream's BLS passes the request's output names on,
            # lib/triton_decoder.py _llm_outputs); the token ids are always needed to make the text.
            wanted = list(dict.fromkeys(["output_ids", "sequence_length", "batch_index",
                                         *(n for n in LLM_OUTPUTS + LLM_EXTRA_OUTPUTS if n in requested)]))
            detoks: dict[int, IncrementalDetokenizer] = {}
            for response in self._llm_responses(request, self._preprocess(request), wanted):
                if response.has_error():
                    raise RuntimeError(response.error().message())
                out = pb_utils.get_output_tensor_by_name(response, "output_ids")
                if out is None:  # the empty final response of a decoupled stream
                    continue
                index_tensor = pb_utils.get_output_tensor_by_name(response, "batch_index")
                index = int(index_tensor.as_numpy().reshape(-1)[0]) if index_tensor is not None else 0
                detok = detoks.setdefault(index, IncrementalDetokenizer(self.tokenizer, self.anchor, True))
                length = int(pb_utils.get_output_tensor_by_name(response, "sequence_length").as_numpy().reshape(-1)[0])
                ids = out.as_numpy().reshape(-1)[:length].astype(np.int32).tolist()
                extras = {}
                for name in wanted[3:]:
                    tensor = pb_utils.get_output_tensor_by_name(response, name)
                    if tensor is not None:
                        extras[name] = tensor.as_numpy()
                if index_tensor is not None:
                    extras["batch_index"] = index_tensor.as_numpy()
                # Streaming: each delta as it comes; not streaming: the prompt's whole text (tensorrt_llm answered
                # it in one response, so its extras are the totals).
                text = detok.add(ids) if streaming else detok.add(ids) + detok.flush()
                if streaming and getattr(sender, "is_cancelled", lambda: False)():
                    break
                sender.send(self._response(text, ids, extras, requested), flags=0 if self.decoupled else FINAL)
                if not self.decoupled:
                    return
            if self.decoupled:
                # As upstream's BLS does (tensorrt_llm_bls/1/model.py execute): the stream closes with a final flag.
                sender.send(flags=FINAL)
            else:
                raise RuntimeError(f"{self.llm_name} sent no response")
        except Exception as err:
            sender.send(
                pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(f"tensorrt_llm_bls: {err}")),
                flags=FINAL,
            )

    @staticmethod
    def _response(text: str, ids: list[int], extras: dict[str, np.ndarray], requested: set[str]):
        """One response; text_output is 1-D ([batch x beams] = [1]), as upstream's postprocessing OUTPUT, which its
        BLS returns (its clients decode as_numpy("text_output")[0])."""
        n = len(ids)
        tensors = {
            "text_output": np.array([text.encode("utf-8")], dtype=object),
            "output_ids": np.array(ids, dtype=np.int32).reshape(1, 1, n),
            "sequence_length": np.array([[n]], dtype=np.int32),
            **extras,
        }
        return pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor(name, value) for name, value in tensors.items() if name in requested])

    def execute(self, requests):
        # Every request is answered through its response sender from a worker, decoupled or not, so one slow
        # generation holds no other up.
        for request in requests:
            sender = request.get_response_sender()

            def work(request=request, sender=sender):
                try:
                    self._run(request, sender)
                finally:
                    with self.lock:
                        self.threads.discard(threading.current_thread())

            thread = threading.Thread(target=work, name="trtpipe-bls", daemon=True)
            with self.lock:
                self.threads.add(thread)
            thread.start()
        return None

    def finalize(self):
        with self.lock:
            threads = list(self.threads)
        for thread in threads:
            thread.join(timeout=5)
