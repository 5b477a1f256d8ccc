"""A spec's checkpoint converted afresh into a temporary directory: parity's independent reference.

`trtpipe smoke --parity SPEC` compares what a server answers with the reference runtime run on this
fresh conversion of the spec's model, never on the stored bytes the server itself loads: a stored
engine damaged or replaced behind its digest then fails parity instead of agreeing with itself.
(Conversion is deterministic, so a correct served engine gives exactly the same greedy tokens.)
A spec with backend llm-api is exported afresh the same way (trtpipe.checkpoint.hf_export): the reference runtime
then runs the Hugging Face-format artifact, as the llmapi repository's cpu-reference model does.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trtpipe import model_semantics, quant

from trtpipe.checkpoint.convert import convert_checkpoint
from trtpipe.checkpoint.hf_export import export_hf_artifact
from trtpipe.errors import InvalidInput
from trtpipe.reference.parity import ParityReference
from trtpipe.resolve import resolve
from trtpipe.spec_loader import load_spec
from trtpipe.toolchain import backend_facts


# The original model is run by transformers on this host's CPU in float32 for `smoke --parity`: bounded, so a 70B
# model does not take a GPU host's memory (about 4 bytes a parameter; 8 GiB of safetensors is a ~4B fp16 model).
HF_PARITY_MAX_BYTES = 8 * 2**30


def _original_model(resolved: Any) -> tuple[Path | None, str | None]:
    """The local original HF model parity may run with transformers, or None and why not."""
    model_dir = resolved.model_dir
    if model_dir is None:
        return None, "the spec names no local model folder"
    weights = list(Path(model_dir).glob("*.safetensors"))
    if not weights:
        return None, f"{model_dir} holds no .safetensors weights"
    size = sum(w.stat().st_size for w in weights)
    if size > HF_PARITY_MAX_BYTES:
        return None, (f"the original model is {size / 2**30:.1f} GiB, more than the {HF_PARITY_MAX_BYTES // 2**30} GiB "
                      "transformers runs on this CPU for parity")
    return Path(model_dir), None


def parity_reference(resolved: Any, engine_dir: Path, tokenizer_dir: Path) -> ParityReference:
    """What smoke --parity compares with, for `resolved`'s model converted into `engine_dir`: the model's semantics
    that a checkpoint does not carry (trtpipe.model_semantics) and the original model."""
    spec, config = resolved.spec, resolved.model_config
    windows = model_semantics.attention_windows(config, spec.limits.max_seq_len)
    thresholds = [w for w in (windows or []) if w < spec.limits.max_seq_len]
    rope = config.get("rope_scaling") if isinstance(config.get("rope_scaling"), dict) else {}
    original = rope.get("original_max_position_embeddings")
    if isinstance(original, int) and original < spec.limits.max_seq_len:
        thresholds.append(original)
    hf_dir, skipped = _original_model(resolved)
    unquantized = spec.quantization.algo == "none" and quant.KV_CACHES[spec.quantization.kv_cache].checkpoint_algo is None
    return ParityReference(
        engine_dir=engine_dir, tokenizer_dir=tokenizer_dir, hf_dir=hf_dir, hf_skipped=skipped,
        attention_windows=windows, token_vocab_size=model_semantics.token_vocab_size(config), exact=unquantized,
        threshold_tokens=max(thresholds) if thresholds else None, max_input_len=spec.limits.max_input_len,
        max_seq_len=spec.limits.max_seq_len)


@contextlib.contextmanager
def converted_afresh(spec_path: Path, configs: Path | None = None) -> Iterator[ParityReference]:
    """Yield what parity compares with for `spec_path`'s model, converted now (the TRT-LLM checkpoint, or the
    LLM-API artifact for backend llm-api), with the original model when it is here; removed afterwards (`configs`:
    the build_configs/ folder to resolve with, None for the shipped one)."""
    resolved = resolve(load_spec(Path(spec_path)), configs=configs)
    tokenizer_dir = resolved.tokenizer_dir or resolved.model_dir
    if tokenizer_dir is None:
        raise InvalidInput(f"{spec_path}: the spec names no local tokenizer or model directory",
                           fix="set model.path (or model.tokenizer) so parity can tokenize like the server")
    with tempfile.TemporaryDirectory(prefix="trtpipe-parity-") as tmp:
        out = Path(tmp) / "checkpoint"
        out.mkdir()
        if backend_facts(resolved.backend_kind).artifact == "hf-export":
            export_hf_artifact(resolved, out, show_progress=False)
        else:
            convert_checkpoint(resolved, out, show_progress=False)
        yield parity_reference(resolved, out, Path(tokenizer_dir))
