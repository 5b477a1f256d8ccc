"""Conversions of the tiny example models, made once per session and shared by the checkpoint tests.

`converted(arch, algo, kv_cache="auto", tp=1, pp=1, group_size=128, dtype="auto")` returns the checkpoint
directory; a second call with the same recipe returns the same directory without converting again.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from trtpipe.checkpoint.recipes import convert_local


@pytest.fixture(scope="session")
def converted(
    tiny_llama_dir: Path, tiny_qwen2_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Callable[..., Path]:
    root = tmp_path_factory.mktemp("checkpoints")
    models = {"llama": tiny_llama_dir, "qwen2": tiny_qwen2_dir}
    made: dict[tuple, Path] = {}

    def convert(arch: str, algo: str, **recipe: object) -> Path:
        key = (arch, algo, tuple(sorted(recipe.items())))
        if key not in made:
            name = "-".join([arch, algo] + [f"{k}{v}" for k, v in sorted(recipe.items())])
            made[key] = Path(convert_local(models[arch], root / name, algo=algo, **recipe).out_dir)
        return made[key]

    return convert
