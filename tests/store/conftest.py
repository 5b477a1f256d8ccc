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


@pytest.fixture(scope="module")
def oci_registry(tmp_path_factory: pytest.TempPathFactory):
    """A real registry (Debian's docker-registry) on 127.0.0.1 with htpasswd auth; yields (host, user, password)."""
    import shutil
    import socket
    import time

    binary = shutil.which("docker-registry")
    if binary is None:
        pytest.skip("docker-registry is not installed (apt-get install -y docker-registry)")
    import bcrypt
    import requests

    base = tmp_path_factory.mktemp("registry")
    user, password = "builder", "store-test-password"
    htpasswd = base / "htpasswd"  # written first: a missing file makes the registry invent a password
    htpasswd.write_text(f"{user}:{bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=5)).decode()}\n")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = base / "config.yml"
    config.write_text(
        f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {base / 'data'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\n  secret: store-test\n  draintimeout: 5s\n"
        f"auth:\n  htpasswd:\n    realm: store-test\n    path: {htpasswd}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("REGISTRY_")}
    proc = subprocess.Popen([binary, "serve", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=env)
    host = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if requests.get(f"http://{host}/v2/", timeout=1).status_code == 401:
                    break
            except requests.RequestException:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("docker-registry did not start")
            time.sleep(0.05)
        yield host, user, password
    finally:
        proc.terminate()
        proc.wait(timeout=10)
