"""Fixtures shared by every test area. Area-specific fixtures live in tests/<area>/conftest.py."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A deterministic, briefly trained tiny Llama HF directory (safetensors + tokenizer)."""
    from trtpipe.checkpoint.example_model import write_example_model

    out = tmp_path_factory.mktemp("models") / "tiny-llama"
    write_example_model(out, arch="llama")
    return out


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Qwen2 variant of the tiny model (QKV bias)."""
    from trtpipe.checkpoint.example_model import write_example_model

    out = tmp_path_factory.mktemp("models") / "tiny-qwen2"
    write_example_model(out, arch="qwen2")
    return out


@pytest.fixture
def trtpipe_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An isolated artifact store for one test."""
    home = tmp_path / "trtpipe-home"
    home.mkdir()
    monkeypatch.setenv("TRTPIPE_HOME", str(home))
    return home
