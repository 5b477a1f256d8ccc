"""Serving fixtures: the tiny example built and published for real, and a real tritonserver on loopback.

Other areas (bench) build the same thing with the `publish_example` fixture (tests/conftest.py)
and `trtpipe.serving.server.start_server(repo)`.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from trtpipe.settings import Settings


@pytest.fixture(scope="session")
def example_repo(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path, publish_example) -> Path:
    """The published repository of the tiny Llama (cpu-reference, streaming), built by the real pipeline."""
    return publish_example(tmp_path_factory.mktemp("serving-example"), model_dir=tiny_llama_dir)


@pytest.fixture(scope="session")
def triton_server(example_repo: Path) -> Iterator["TritonServerHandle"]:  # noqa: F821
    """A real tritonserver serving the example repository; stopped at the end of the session."""
    from trtpipe.serving.server import start_server

    handle = start_server(example_repo, start_timeout=180, settings=Settings.from_env())
    try:
        yield handle
    finally:
        handle.stop()


@pytest.fixture
def repo_copy(example_repo: Path, tmp_path: Path) -> Path:
    """A private, writable copy of the example repository, for tests that break it."""
    copy = tmp_path / "repo"
    shutil.copytree(example_repo, copy)
    for path in [copy, *copy.rglob("*")]:
        path.chmod(path.stat().st_mode | 0o200)
    return copy
