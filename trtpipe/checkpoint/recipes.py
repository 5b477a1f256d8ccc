"""Convert a local HF model with a recipe given as arguments instead of a spec file.

For tests, benchmarks and notebooks: writes a small build spec next to the output, resolves it with the real
`trtpipe.resolve` and calls `convert_checkpoint`, so what runs is exactly what `trtpipe convert` runs.
The default calibration is small (4 windows of 64 tokens): enough for the tiny example model, fast on a CPU.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import yaml

from trtpipe.checkpoint.convert import ConvertSummary, convert_checkpoint
from trtpipe.resolve import resolve
from trtpipe.spec_loader import load_spec


def spec_text(
    model_dir: Path,
    *,
    algo: str = "none",
    kv_cache: str = "auto",
    tp: int = 1,
    pp: int = 1,
    group_size: int = 128,
    dtype: str = "auto",
    samples: int = 4,
    max_seq_len: int = 64,
    seed: int = 1234,
    dataset: Path | None = None,
    allow_pickle: bool = False,
    converter: str = "auto",
) -> str:
    calibration: dict[str, object] = {"samples": samples, "max_seq_len": max_seq_len, "seed": seed}
    if dataset is not None:
        calibration["dataset"] = str(Path(dataset).resolve())
    spec = {
        "model": {"path": str(Path(model_dir).resolve()), "dtype": dtype, "allow_pickle": allow_pickle},
        "target": {"gpu": "cpu-reference", "tp": tp, "pp": pp},
        "quantization": {"algo": algo, "kv_cache": kv_cache, "group_size": group_size, "calibration": calibration,
                         "converter": converter},
    }
    return yaml.safe_dump(spec, sort_keys=False)


def convert_local(model_dir: Path, out_dir: Path, **recipe: object) -> ConvertSummary:
    """Convert `model_dir` into a new `out_dir` (atomically) with the recipe keywords of `spec_text`."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        spec_path = staging / "spec.yaml"
        spec_path.write_text(spec_text(model_dir, **recipe), encoding="utf-8")  # type: ignore[arg-type]
        resolved = resolve(load_spec(spec_path))
        checkpoint = staging / "checkpoint"
        checkpoint.mkdir()
        summary = convert_checkpoint(resolved, checkpoint)
        os.rename(checkpoint, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return summary.model_copy(update={"out_dir": str(out_dir)})
