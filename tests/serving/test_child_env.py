"""Servers and stubs run repository code: they get an environment without registry secrets or the
release key (read back from /proc/<pid>/environ of the real tritonserver and its Python stubs)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from trtpipe.settings import SECRET_VARIABLES
from trtpipe.settings import Settings

pytestmark = pytest.mark.timeout(400)

SECRET = "s3cret-never-in-a-child"


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode("utf-8", "replace").split("\0") if "=" in item)


def _group(pgid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid:  # field 5 of stat: the process group
                pids.append(int(entry.name))
    return pids


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc (Linux)")
def test_tritonserver_and_its_stubs_get_no_secret(example_repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trtpipe.serving.server import start_server

    for name in SECRET_VARIABLES:
        monkeypatch.setenv(name, SECRET)
    monkeypatch.setenv("TRTPIPE_TEST_MARKER", "inherited")  # an ordinary variable still reaches them
    with start_server(example_repo, start_timeout=240, settings=Settings.from_env()) as handle:
        pids = _group(handle.pid)
        stubs = [pid for pid in pids if pid != handle.pid]
        assert handle.pid in pids and stubs, "expected tritonserver and at least one Python-backend stub"
        for pid in pids:
            env = _environ(pid)
            assert env.get("TRTPIPE_TEST_MARKER") == "inherited", pid
            assert not set(SECRET_VARIABLES) & set(env), (pid, sorted(set(SECRET_VARIABLES) & set(env)))
            assert SECRET not in "\0".join(env.values())


def test_executor_children_get_no_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trtpipe.engine.executors.base import run_logged_process

    for name in SECRET_VARIABLES:
        monkeypatch.setenv(name, SECRET)
    script = "import os; print(sorted(k for k in os.environ if k.startswith(('TRTPIPE_', 'ORAS_', 'DOCKER_AUTH'))))"
    for env in (None, dict(os.environ)):
        log = tmp_path / "child.log"
        outcome = run_logged_process([sys.executable, "-c", script], log, timeout_s=60, env=env, show_progress=False)
        assert outcome.returncode == 0
        text = log.read_text()
        assert SECRET not in text and not any(name in text for name in SECRET_VARIABLES), text
