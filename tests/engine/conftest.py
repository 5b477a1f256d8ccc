"""Fixtures for the engine tests: resolved example specs (planning only, no weights needed)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "build_configs" / "examples"
GPU_EXAMPLES = ("llama3-8b-fp8-h100", "llama3-8b-int4awq-a100", "llama2-13b-fp16-a100", "llama3-70b-fp8-4xh100")


def resolve_example(name: str):
    from trtpipe.resolve import resolve
    from trtpipe.spec_loader import load_spec

    return resolve(load_spec(EXAMPLES / f"{name}.yaml"), need_weights=False)


def resolve_text(tmp_path: Path, text: str):
    """Resolve a spec written into tmp_path (planning only); relative paths are against tmp_path."""
    from trtpipe.resolve import resolve
    from trtpipe.spec_loader import load_spec

    path = tmp_path / "spec.yaml"
    path.write_text(text, encoding="utf-8")
    return resolve(load_spec(path), need_weights=False)


def with_toolchain(resolved, toolchain_name: str):
    from trtpipe.toolchain import get_toolchain

    return dataclasses.replace(resolved, toolchain=get_toolchain(toolchain_name))


@pytest.fixture
def llama8b_config() -> Path:
    return REPO / "build_configs" / "models" / "llama-3-8b" / "config.json"
