"""trtpipe postprocessing model (Triton Python backend): token ids -> text.

Uses the `tokenizers` library directly (no torch). Each response of a stream reaches this model
as its own request holding only the new tokens, so the text of a chunk is decoded after an
anchor token and the anchor's text removed: that keeps the leading space a word-initial token
carries (sentencepiece drops it at the start of a sequence). Byte sequences split across chunks
are only joined correctly by tensorrt_llm_bls, which keeps state per request.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils
from tokenizers import Tokenizer


def _param(model_config: dict, key: str, default: str = "") -> str:
    return model_config.get("parameters", {}).get(key, {}).get("string_value", default)


def anchor_id(tokenizer: Tokenizer) -> int:
    """A plain token to decode after, so a chunk keeps its leading space."""
    for text in ("a", "the", "x", "0"):
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        if len(ids) == 1:
            return ids[0]
    return 0


def decode_chunk(tokenizer: Tokenizer, anchor: int, ids: list[int], skip_special_tokens: bool) -> str:
    if not ids:
        return ""
    prefix = tokenizer.decode([anchor], skip_special_tokens=skip_special_tokens)
    text = tokenizer.decode([anchor, *ids], skip_special_tokens=skip_special_tokens)
    return text[len(prefix):] if text.startswith(prefix) else tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = json.loads(args["model_config"])
        model_dir = Path(args["model_repository"])
        tok_dir = model_dir / _param(self.model_config, "tokenizer_dir", "tokenizer")
        self.tokenizer = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
        self.skip_special_tokens = _param(self.model_config, "skip_special_tokens", "true") == "true"
        self.anchor = anchor_id(self.tokenizer)

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                tokens = pb_utils.get_input_tensor_by_name(request, "TOKENS_BATCH").as_numpy()
                lengths = pb_utils.get_input_tensor_by_name(request, "SEQUENCE_LENGTH").as_numpy()
                # [batch, beams, tokens]; a response with no new token (the end of a stream) has 0 tokens.
                if tokens.ndim == 2:
                    tokens = tokens[:, None, :]
                elif tokens.ndim == 1:
                    tokens = tokens[None, None, :]
                lengths = lengths.reshape(tokens.shape[0], tokens.shape[1])
                # One text per sequence, flattened over batch and beams: OUTPUT is 1-D ([batch x beams]) as upstream's
                # postprocessing returns it (tensorrtllm_backend c2e65b88 postprocessing/1/model.py execute), and its
                # clients read as_numpy("text_output")[0] as bytes.
                texts = []
                for b in range(tokens.shape[0]):
                    for beam in range(tokens.shape[1]):
                        ids = tokens[b, beam, : int(lengths[b, beam])].tolist()
                        texts.append(decode_chunk(self.tokenizer, self.anchor, ids, self.skip_special_tokens).encode("utf-8"))
                outputs = [
                    pb_utils.Tensor("OUTPUT", np.array(texts, dtype=object)),
                    # The token ids pass through, so the ensemble can offer output_ids / sequence_length without
                    # exposing a tensor that also feeds this step (a request for text_output alone would then get no
                    # answer, or "unexpected deadlock" when not decoupled).
                    pb_utils.Tensor("OUT_TOKENS_BATCH", tokens.astype(np.int32)),
                    pb_utils.Tensor("OUT_SEQUENCE_LENGTH", lengths.astype(np.int32)),
                ]
                responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
            except Exception as err:
                responses.append(
                    pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(f"postprocessing: {err}"))
                )
        return responses
