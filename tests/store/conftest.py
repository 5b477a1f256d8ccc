"""Fixtures of the store area: a tiny cpu-reference spec, a store, helpers to run the CLI in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trtpipe.store.local import Store

TINY_SPEC = """\
model:
  path: {model}
target:
  gpu: cpu-reference
engine:
  max_batch_size: 4
  max_input_len: 64
  max_seq_len: 128
release:
  gates:
    prod:
      parity: true
"""


@pytest.fixture(scope="session")
def tiny_spec(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("store-spec")
    path = folder / "tiny.yaml"
    path.write_text(TINY_SPEC.format(model=tiny_llama_dir))
    return path


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store.open(tmp_path / "store")


def trtpipe_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "trtpipe.cli", *args]


def cli_env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["TRTPIPE_HOME"] = str(home)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_cli(home: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(trtpipe_cmd(*args), env=cli_env(home), capture_output=True, text=True, timeout=timeout)


def built_lines(home: Path) -> list[dict]:
    log = home / "builds.log"
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def visible_entries_complete(home: Path) -> list[str]:
    """Problems with any visible entry (each must have a manifest and verify)."""
    store = Store(home)
    problems: list[str] = []
    for kind in ("checkpoint", "engine", "repository"):
        folder = home / kind
        if not folder.is_dir():
            continue
        for child in folder.iterdir():
            entry = store.peek(kind, child.name)
            if entry is None:
                problems.append(f"{kind}/{child.name}: visible without manifest")
                continue
            problems += [f"{kind}/{child.name}: {p.file}: {p.reason}" for p in store.check(entry, digests=True)]
    return problems


class Tools:
    """Helpers for the tests of this area (conftest modules cannot be imported under importlib mode)."""

    trtpipe_cmd = staticmethod(trtpipe_cmd)
    cli_env = staticmethod(cli_env)
    run_cli = staticmethod(run_cli)
    built_lines = staticmethod(built_lines)
    visible_entries_complete = staticmethod(visible_entries_complete)


@pytest.fixture
def tools() -> type[Tools]:
    return Tools
