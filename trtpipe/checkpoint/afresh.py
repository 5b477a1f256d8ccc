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

from trtpipe.checkpoint.convert import convert_checkpoint
from trtpipe.checkpoint.hf_export import export_hf_artifact
from trtpipe.errors import InvalidInput
from trtpipe.resolve import resolve
from trtpipe.spec_loader import load_spec


@contextlib.contextmanager
def converted_afresh(spec_path: Path) -> Iterator[tuple[Path, Path]]:
    """Yield (checkpoint dir, tokenizer dir) of `spec_path`'s model, converted now (the TRT-LLM checkpoint, or the
    LLM-API artifact for backend llm-api); removed afterwards."""
    resolved = resolve(load_spec(Path(spec_path)))
    tokenizer_dir = resolved.tokenizer_dir or resolved.model_dir
    if tokenizer_dir is None:
        raise InvalidInput(f"{spec_path}: the spec names no local tokenizer or model directory",
                           fix="set model.path (or model.tokenizer) so parity can tokenize like the server")
    with tempfile.TemporaryDirectory(prefix="trtpipe-parity-") as tmp:
        out = Path(tmp) / "checkpoint"
        out.mkdir()
        if resolved.backend_kind == "llm-api":
            export_hf_artifact(resolved, out, show_progress=False)
        else:
            convert_checkpoint(resolved, out, show_progress=False)
        yield out, Path(tokenizer_dir)
