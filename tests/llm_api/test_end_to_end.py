"""The issue's acceptance path for the LLM-API track, as a user runs it: `trtpipe build` of a cpu-reference spec with
`backend: llm-api` stores the artifact and the llmapi repository, `trtpipe validate` accepts it, `trtpipe serve`
serves it with the real tritonserver, `trtpipe smoke --parity SPEC` passes (parity against a fresh export, never
the stored bytes), `trtpipe bench` runs and both results are recorded under the served repository's digest."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from trtpipe.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_build_validate_serve_smoke_parity_bench(tiny_spec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from trtpipe.results import ResultsLog
    from trtpipe.serving.identity import record_target
    from trtpipe.store.local import Store

    home = tmp_path / "home"
    monkeypatch.setenv("TRTPIPE_HOME", str(home))
    spec = tiny_spec(algo="fp8", kv_cache="fp8", triton={"streaming": True})
    assert main(["build", str(spec), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    repo = Path(report["repository_path"])
    assert json.loads((repo / "trtpipe.json").read_text())["layout"] == "llmapi"
    assert main(["validate", str(repo)]) == 0

    target = record_target(repo, Store(home))
    env = {**os.environ, "TRTPIPE_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "trtpipe.cli", "serve", str(repo), "--json"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # printed once every model is ready
        assert line, proc.stderr.read()
        info = json.loads(line)
        assert info["models"] == ["tensorrt_llm"] and info["repository_digest"] == target.digest
        assert main(["smoke", info["grpc_url"], "--parity", str(spec), "--record", str(repo)]) == 0
        assert main(["bench", info["grpc_url"], "--mode", "closed", "--concurrency", "2", "--requests", "4",
                     "--input-len", "8", "--output-len", "4", "--tokenizer", str(repo),
                     "--record", str(repo)]) == 0
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    kinds = {r.kind for r in ResultsLog(home).for_digest(target.digest)}
    assert {"smoke", "bench"} <= kinds
