"""Fixtures for the foundation tests: the real CLI in-process, spec files, shipped model configs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from trtpipe.cli import main
from trtpipe.shipped import shipped_build_configs_dir

DATA = Path(__file__).parent / "data"


@dataclass
class CliResult:
    code: int
    out: str
    err: str

    def json(self) -> dict:
        return json.loads(self.out)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]):
    """Run `trtpipe ARGS...` in-process through the real entry point."""

    def run(*args: str) -> CliResult:
        code = main([str(a) for a in args])
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


@pytest.fixture
def models_dir() -> Path:
    return shipped_build_configs_dir() / "models"


@pytest.fixture
def examples_dir() -> Path:
    return shipped_build_configs_dir() / "examples"


@pytest.fixture
def hf_dir(tmp_path: Path, models_dir: Path) -> Path:
    """A local 'HF folder' with a real Llama-3-8B config.json, a placeholder safetensors file and a small real
    tokenizer (two words and an end token).

    Resolve checks the weights exist (it never reads them) and loads the tokenizer as the serving models do
    (issue 14: a tokenizer that does not load is refused when the build resolves).
    """
    from tokenizers import Tokenizer, models

    folder = tmp_path / "llama-3-8b-local"
    folder.mkdir()
    (folder / "config.json").write_text((models_dir / "llama-3-8b" / "config.json").read_text())
    (folder / "model.safetensors").write_bytes(b"")
    Tokenizer(models.WordLevel({"<unk>": 0, "</s>": 1, "hello": 2}, unk_token="<unk>")).save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text('{"eos_token": "</s>"}')
    return folder


@pytest.fixture
def recorded_a100() -> Path:
    return DATA / "a100-sxm4-80gb-x2.nvml.json"


@pytest.fixture
def recorded_h100() -> Path:
    return DATA / "h100-80gb-hbm3-x4.nvml.json"
