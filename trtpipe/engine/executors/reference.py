"""The reference executor: the `cpu-reference` target's "engine".

No TensorRT anywhere: the engine directory is shaped like trtllm-build's output (config.json with
`version`, `pretrained_config`, `build_config`) and marked `trtpipe_reference: true`; the weights are
the checkpoint's rank{N}.safetensors, hard-linked when the filesystem allows (copied otherwise).
The reference runtime and the Triton reference model load it.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from trtpipe.checkpoint.schema import validate_checkpoint
from trtpipe.engine.executors.base import ExecutorResult
from trtpipe.errors import IntegrityError
from trtpipe.model_semantics import TOKEN_VOCAB_KEY


def checkpoint_rank_files(checkpoint_dir: Path, world_size: int) -> list[Path]:
    """rank0..rank{world_size-1}.safetensors of a TRT-LLM checkpoint; IntegrityError naming what is missing."""
    files = [checkpoint_dir / f"rank{rank}.safetensors" for rank in range(world_size)]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise IntegrityError(
            f"checkpoint {checkpoint_dir} lacks {', '.join(missing)} for world size {world_size}",
            path=str(checkpoint_dir), fix="rebuild the checkpoint stage from its inputs",
        )
    return files


def link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:  # another filesystem, or links not allowed
        shutil.copy2(source, target)


class ReferenceExecutor:
    name = "reference"

    def __init__(self, spec: Any = None, *, token_vocab_size: int | None = None) -> None:
        self.spec = spec
        # The tokenizer's vocabulary (trtpipe.model_semantics.token_vocab_size): recorded in config.json when the
        # checkpoint pads its embedding and head beyond it, so the reference runtime never samples a padded id.
        self.token_vocab_size = token_vocab_size

    def run(self, plan: Any, checkpoint_dir: Path, out_dir: Path, log: Path) -> ExecutorResult:
        started = time.monotonic()
        checkpoint_dir = Path(checkpoint_dir)
        out_dir = Path(out_dir)
        log.parent.mkdir(parents=True, exist_ok=True)
        config_path = checkpoint_dir / "config.json"
        if not config_path.is_file():
            raise IntegrityError(f"checkpoint {checkpoint_dir} has no config.json", path=str(checkpoint_dir),
                                 fix="rebuild the checkpoint stage from its inputs")
        validate_checkpoint(checkpoint_dir, self.spec)
        pretrained = json.loads(config_path.read_text(encoding="utf-8"))
        mapping = pretrained.get("mapping") or {}
        world = int(mapping.get("world_size") or int(mapping.get("tp_size", 1)) * int(mapping.get("pp_size", 1)))
        if world != plan.world_size:
            raise IntegrityError(
                f"checkpoint world size {world} != plan world size {plan.world_size} (tp={plan.tp}, pp={plan.pp})",
                path=str(checkpoint_dir), fix="rebuild the checkpoint with the spec's tp/pp",
            )
        rank_files = checkpoint_rank_files(checkpoint_dir, world)
        out_dir.mkdir(parents=True, exist_ok=True)
        with open(log, "a", encoding="utf-8") as out:
            out.write(f"[trtpipe] reference engine for {plan.target_gpu}, TensorRT-LLM {plan.trtllm_version} layout\n")
            for source in rank_files:
                link_or_copy(source, out_dir / source.name)
                out.write(f"[trtpipe] {source.name} linked\n")
            config = {
                "version": plan.trtllm_version,
                "pretrained_config": pretrained,
                "build_config": plan.build_config,
                "trtpipe_reference": True,
            }
            if self.token_vocab_size is not None and int(pretrained.get("vocab_size", 0)) > self.token_vocab_size:
                config[TOKEN_VOCAB_KEY] = self.token_vocab_size
            tmp = out_dir / "config.json.tmp"
            tmp.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
            os.replace(tmp, out_dir / "config.json")
            out.write("[trtpipe] config.json written\n")
        return ExecutorResult(
            executor=self.name, returncode=0, log_path=log, duration_s=time.monotonic() - started,
            command=[], tensorrt_version=None, gpu_sm=None,
        )
