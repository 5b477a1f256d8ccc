"""trtpipe preprocessing model (Triton Python backend): text -> token ids.

Uses the `tokenizers` library directly (no torch, no transformers) so the stub starts in about
a second. Inputs and outputs follow the inflight_batcher_llm preprocessing contract; every answer carries what upstream's
always carries (INPUT_ID, DECODER_INPUT_ID, the lengths, stop/bad words, EMBEDDING_BIAS, end and pad ids). It is a text
preprocessor: the declared multimodal, encoder-decoder, embedding-bias and prompt-table inputs are refused
with a one-line error naming the input when a request carries them (their outputs are never produced).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils
from tokenizers import Tokenizer


def _param(model_config: dict, key: str, default: str = "") -> str:
    return model_config.get("parameters", {}).get(key, {}).get("string_value", default)


def _special_token_id(tokenizer: Tokenizer, value) -> int | None:
    if isinstance(value, dict):
        value = value.get("content")
    if not value:
        return None
    return tokenizer.token_to_id(value)


def load_tokenizer(model_dir: Path, model_config: dict) -> tuple[Tokenizer, int, int]:
    """The tokenizer and its end and pad ids (tokenizer_config, then generation_config)."""
    tok_dir = model_dir / _param(model_config, "tokenizer_dir", "tokenizer")
    tokenizer = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    tok_config = {}
    if (tok_dir / "tokenizer_config.json").is_file():
        tok_config = json.loads((tok_dir / "tokenizer_config.json").read_text())
    gen_config = {}
    if (tok_dir / "generation_config.json").is_file():
        gen_config = json.loads((tok_dir / "generation_config.json").read_text())
    end_id = _special_token_id(tokenizer, tok_config.get("eos_token"))
    if end_id is None:
        eos = gen_config.get("eos_token_id")
        end_id = eos[0] if isinstance(eos, list) else eos
    if end_id is None:
        raise ValueError(f"{tok_dir}: cannot tell the end token (no eos_token in tokenizer_config.json)")
    pad_id = _special_token_id(tokenizer, tok_config.get("pad_token"))
    if pad_id is None:
        pad_id = gen_config.get("pad_token_id", end_id)
    return tokenizer, int(end_id), int(pad_id)


def words_to_list(tokenizer: Tokenizer, words_batch: list[list[str]]) -> np.ndarray:
    """Words per request -> the [batch, 2, L] stop/bad words tensor of TRT-LLM.

    Row 0 holds the concatenated token ids, row 1 the end offset of each word (then -1 padding).
    """
    flat_ids: list[list[int]] = []
    offsets: list[list[int]] = []
    for words in words_batch:
        ids: list[int] = []
        ends: list[int] = []
        for word in words:
            if not word:
                continue
            word_ids = tokenizer.encode(word, add_special_tokens=False).ids
            if not word_ids:
                continue
            ids.extend(word_ids)
            ends.append(len(ids))
        flat_ids.append(ids)
        offsets.append(ends)
    width = max(1, max((len(x) for x in flat_ids), default=0))
    out = np.zeros((len(words_batch), 2, width), dtype=np.int32)
    out[:, 1, :] = -1
    for i, (ids, ends) in enumerate(zip(flat_ids, offsets)):
        out[i, 0, : len(ids)] = ids
        out[i, 1, : len(ends)] = ends
    return out


def ban_ids(words: np.ndarray, ids: list[int]) -> np.ndarray:
    """The [batch, 2, L] words tensor with each of `ids` appended as a one-token banned word (every batch row)."""
    if not ids:
        return words
    rows = []
    for row in words:
        used = [int(e) for e in row[1] if e >= 0]
        flat = [int(t) for t in row[0][: used[-1] if used else 0]]
        ends = used + [len(flat) + i + 1 for i in range(len(ids))]
        rows.append((flat + list(ids), ends))
    width = max(len(flat) for flat, _ in rows)
    out = np.zeros((len(rows), 2, width), dtype=np.int32)
    out[:, 1, :] = -1
    for i, (flat, ends) in enumerate(rows):
        out[i, 0, : len(flat)] = flat
        out[i, 1, : len(ends)] = ends
    return out


# Inputs of the upstream contract this text preprocessor does not handle -> what they are for.
UNSUPPORTED_INPUTS = {
    "DECODER_QUERY": "encoder-decoder models",
    "IMAGE_BYTES": "multimodal models",
    "IMAGE_URL": "multimodal models",
    "IMAGES": "multimodal models",
    "IMAGE_SIZES": "multimodal models",
    "VIDEO_BYTES": "multimodal models",
    "EMBEDDING_BIAS_WORDS": "an embedding bias",
    "EMBEDDING_BIAS_WEIGHTS": "an embedding bias",
    "PROMPT_TABLE_EXTRA_ID": "prompt tuning tables",
}


def _strings(tensor) -> list[list[str]]:
    array = tensor.as_numpy()
    array = array.reshape(array.shape[0], -1)
    return [[x.decode("utf-8") if isinstance(x, bytes) else str(x) for x in row] for row in array]


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = json.loads(args["model_config"])
        model_dir = Path(args["model_repository"])
        self.tokenizer, self.end_id, self.pad_id = load_tokenizer(model_dir, self.model_config)
        self.add_special_tokens = _param(self.model_config, "add_special_tokens", "true") == "true"
        self.max_input_len = int(_param(self.model_config, "max_input_len", "0") or 0)
        # A checkpoint padded beyond the tokenizer (ModelOpt pads INT4-AWQ embeddings and heads to a multiple of 64)
        # holds ids that are no token: banned in every request, so no sampler returns one (trtpipe.model_semantics).
        vocab = int(_param(self.model_config, "vocab_size", "0") or 0)
        padded = int(_param(self.model_config, "padded_vocab_size", "0") or 0)
        self.padding_ids = list(range(vocab, padded)) if 0 < vocab < padded else []

    def execute(self, requests):
        return [self._one(request) for request in requests]

    def _one(self, request):
        try:
            for name, feature in UNSUPPORTED_INPUTS.items():
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                if tensor is not None and tensor.as_numpy().size:
                    raise ValueError(f"input {name} ({feature}) is not supported: trtpipe's preprocessing is text-only; "
                                     "omit it")
            queries = [row[0] for row in _strings(pb_utils.get_input_tensor_by_name(request, "QUERY"))]
            batch = len(queries)
            out_len = pb_utils.get_input_tensor_by_name(request, "REQUEST_OUTPUT_LEN").as_numpy()
            encoded = [self.tokenizer.encode(q, add_special_tokens=self.add_special_tokens).ids for q in queries]
            if any(not ids for ids in encoded):
                raise ValueError("empty prompt: text_input tokenizes to no tokens")
            longest = max(len(ids) for ids in encoded)
            if self.max_input_len and longest > self.max_input_len:
                # Refused here with the same words on every target (the C++ backend's message is terse).
                raise ValueError(
                    f"input length {longest} exceeds the engine's max_input_len {self.max_input_len}; "
                    "shorten the prompt or rebuild with a larger engine.max_input_len"
                )
            width = max(len(ids) for ids in encoded)
            input_ids = np.full((batch, width), self.pad_id, dtype=np.int32)
            for i, ids in enumerate(encoded):
                input_ids[i, : len(ids)] = ids
            lengths = np.array([[len(ids)] for ids in encoded], dtype=np.int32)

            def words(name: str) -> np.ndarray:
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                batch_words = _strings(tensor) if tensor is not None else [[] for _ in range(batch)]
                return words_to_list(self.tokenizer, batch_words)

            def ids_or_default(name: str, default: int) -> np.ndarray:
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                if tensor is None:
                    return np.full((batch, 1), default, dtype=np.int32)
                return tensor.as_numpy().astype(np.int32).reshape(batch, 1)

            pad_ids = ids_or_default("PAD_ID", self.pad_id)
            outputs = [
                pb_utils.Tensor("INPUT_ID", input_ids),
                # Upstream always answers with a decoder input: the pad id, length 1, when no DECODER_QUERY is given
                # (tensorrtllm_backend c2e65b88 all_models/inflight_batcher_llm/preprocessing/1/model.py execute);
                # its clients read it and the tensorrt_llm model ignores it on a decoder-only engine.
                pb_utils.Tensor("DECODER_INPUT_ID", pad_ids.copy()),
                pb_utils.Tensor("REQUEST_DECODER_INPUT_LEN", np.ones((batch, 1), dtype=np.int32)),
                # No embedding bias: an empty [batch, 0] tensor, as upstream's _get_embedding_bias returns.
                pb_utils.Tensor("EMBEDDING_BIAS", np.empty((batch, 0), dtype=np.float32)),
                pb_utils.Tensor("REQUEST_INPUT_LEN", lengths),
                pb_utils.Tensor("REQUEST_OUTPUT_LEN", out_len.astype(np.int32).reshape(batch, 1)),
                pb_utils.Tensor("STOP_WORDS_IDS", words("STOP_WORDS_DICT")),
                pb_utils.Tensor("BAD_WORDS_IDS", ban_ids(words("BAD_WORDS_DICT"), self.padding_ids)),
                pb_utils.Tensor("OUT_END_ID", ids_or_default("END_ID", self.end_id)),
                pb_utils.Tensor("OUT_PAD_ID", pad_ids),
            ]
            return pb_utils.InferenceResponse(output_tensors=outputs)
        except Exception as err:  # the client gets the message, the server keeps running
            return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(f"preprocessing: {err}"))
