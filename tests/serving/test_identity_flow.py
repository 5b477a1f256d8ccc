"""Issue 11, end to end with a real tritonserver: serving never changes the store, results bind to what the
server reports serving, and parity does not trust the stored engine."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from trtpipe.cli import main
from trtpipe.settings import Settings

pytestmark = pytest.mark.timeout(600)


def _store_files(home: Path) -> dict[str, str]:
    """sha256 of every file under the store's entries (the artifacts), by path."""
    out = {}
    for kind in ("checkpoint", "engine", "repository"):
        for path in sorted((home / kind).rglob("*")):
            if path.is_file():
                out[str(path.relative_to(home))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


@contextmanager
def served(repo: Path, home: Path) -> Iterator[dict]:
    """`trtpipe serve REPO --json` in a subprocess (as a user runs it); SIGTERM at the end."""
    env = {**os.environ, "TRTPIPE_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "trtpipe.cli", "serve", str(repo), "--json"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # printed once every model is ready
        assert line, proc.stderr.read()
        yield json.loads(line)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_build_serve_smoke_bench_then_verify_is_clean_and_the_store_unchanged(example_repo: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from trtpipe.results import ResultsLog
    from trtpipe.serving.identity import record_target
    from trtpipe.store.local import Store

    home = example_repo.parent.parent
    monkeypatch.setenv("TRTPIPE_HOME", str(home))
    before = _store_files(home)
    # Another test's server of this store may be running (a session fixture): what it has is not this test's.
    others = set((home / "serving").iterdir()) if (home / "serving").is_dir() else set()
    target = record_target(example_repo, Store(home))
    earlier = len(ResultsLog(home).for_digest(target.digest))  # an append-only log: this test's come after
    with served(example_repo, home) as info:
        serving_dir = Path(info["serving_dir"])
        assert info["repository_digest"] == target.digest
        assert serving_dir.parent == home / "serving" and serving_dir.is_dir()
        assert main(["smoke", info["grpc_url"], "--record", str(example_repo)]) == 0
        assert main(["bench", info["grpc_url"], "--mode", "closed", "--concurrency", "2", "--requests", "4",
                     "--input-len", "8", "--output-len", "4", "--metrics-url", info["metrics_url"],
                     "--record", str(example_repo)]) == 0
        assert list(serving_dir.rglob("__pycache__"))  # the Python backend did write its bytecode: there
    assert not serving_dir.exists() and set((home / "serving").iterdir()) == others  # removed with the server
    assert main(["cache", "verify"]) == 0
    assert _store_files(home) == before  # byte-identical, no file added or removed
    assert not [p for p in home.rglob("__pycache__") if not any(p.is_relative_to(o) for o in others)]
    records = ResultsLog(home).for_digest(target.digest)[earlier:]
    assert {"smoke", "bench"} <= {r.kind for r in records}
    # Evidence, not assertions: each result carries its run's own record, the served identity included.
    for record in records:
        assert record.origin == "run" and record.evidence is not None, record.kind
        assert record.evidence["command"] in ("trtpipe smoke", "trtpipe bench")
        assert record.evidence["server_url"] == info["grpc_url"]
        assert record.evidence["served"]["repository_digest"] == target.digest


def test_recording_for_another_repository_than_the_served_one_is_refused(triton_server, example_repo: Path,
                                                                        tiny_llama_dir: Path, publish_example,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from trtpipe.serving.identity import record_target
    from trtpipe.store.local import Store

    # Another repository in the same store (the same engine, published non-streaming): B.
    other = publish_example(example_repo.parent.parent.parent, streaming=False, model_dir=tiny_llama_dir)
    home = other.parent.parent
    b = record_target(other, Store(home))
    assert b.digest != triton_server.repository_digest
    results = home / "results" / (b.digest.removeprefix("sha256:") + ".jsonl")
    capsys.readouterr()
    for command in (["smoke", triton_server.grpc_url, "--record", str(other), "--store", str(home)],
                    ["bench", triton_server.grpc_url, "--mode", "closed", "--concurrency", "1", "--requests", "2",
                     "--metrics-url", triton_server.metrics_url, "--record", str(other), "--store", str(home)]):
        assert main(command) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "refused to record" in err and triton_server.repository_digest in err
        assert "nothing recorded" in err and "Traceback" not in err
    assert not results.exists()


def test_a_server_reporting_no_identity_cannot_record(repo_copy: Path, example_repo: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """A repository outside a store (a hand-made copy) has no artifact digest: nothing is recorded for it."""
    from trtpipe.serving.server import start_server

    with start_server(repo_copy, start_timeout=180, settings=Settings.from_env()) as server:
        assert server.repository_digest is None
        capsys.readouterr()
        assert main(["smoke", server.grpc_url, "--record", str(example_repo),
                     "--store", str(example_repo.parent.parent)]) == 2
    err = capsys.readouterr().err
    assert "reports no trtpipe_repository_digest" in err and "nothing recorded" in err


def test_serve_refuses_a_damaged_entry(example_repo: Path, tmp_path: Path) -> None:
    from trtpipe.errors import TrtpipeError
    from trtpipe.serving.server import start_server

    home = tmp_path / "home"
    subprocess.run(["cp", "-a", str(example_repo.parent.parent), str(home)], check=True)  # keeps the hard links
    repo = home / "repository" / example_repo.name
    victim = repo / "postprocessing" / "1" / "model.py"
    victim.chmod(0o644)
    victim.write_text(victim.read_text().replace("import", "import  ", 1))
    serving_before = set((home / "serving").iterdir()) if (home / "serving").exists() else set()
    with pytest.raises(TrtpipeError, match="failed verification"):
        start_server(repo, start_timeout=60, settings=Settings.from_env())
    assert not repo.exists() and list((home / "quarantine").glob("repository-*"))
    assert (set((home / "serving").iterdir()) if (home / "serving").exists() else set()) <= serving_before


def _negated(engine_dir: Path, out: Path) -> None:
    """The engine's files with every floating-point weight negated: a self-consistent but wrong engine."""
    import torch
    from safetensors.torch import load_file, save_file

    for src in engine_dir.iterdir():
        if src.name == "manifest.json":
            continue
        if src.suffix == ".safetensors":
            tensors = {k: (-v if v.is_floating_point() else v) for k, v in load_file(str(src)).items()}
            save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / src.name))
            assert not torch.equal(load_file(str(out / src.name))["transformer.vocab_embedding.weight"],
                                   load_file(str(src))["transformer.vocab_embedding.weight"])
        else:
            (out / src.name).write_bytes(src.read_bytes())


def test_parity_fails_when_the_stored_engine_weights_are_negated(example_repo: Path, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """The engine in the store is replaced behind its key by a self-consistent one with negated weights
    (what building on a corrupt object used to produce); the build reuses it and publishes it. The server
    serves garbage, and parity, which converts the spec's model afresh, says so."""
    from trtpipe.pipeline import run_build
    from trtpipe.serving.server import start_server
    from trtpipe.store.local import Store

    example_dir = example_repo.parent.parent.parent
    spec = example_dir / "spec" / "tiny-llama-cpu.yaml"
    home = tmp_path / "home"
    subprocess.run(["cp", "-a", str(example_dir / "store"), str(home)], check=True)
    store = Store.open(home)
    first = run_build(spec, store=store, progress=False, settings=Settings.from_env())
    engine = store.get("engine", first.keys["engine"])
    with store.building("engine", engine.key, force=True) as b:
        _negated(engine.path, b.dir)
        bad = b.commit(inputs=engine.inputs)
    second = run_build(spec, store=store, progress=False, settings=Settings.from_env())
    assert second.artifacts["engine"] == bad.digest != first.artifacts["engine"]
    assert {s.name: s.outcome for s in second.stages}["publish"] == "built"
    with start_server(Path(second.repository_path), start_timeout=180, settings=Settings.from_env()) as server:
        capsys.readouterr()
        code = main(["smoke", server.grpc_url, "--parity", str(spec), "--json"])
    result = json.loads(capsys.readouterr().out)
    assert code == 1
    checks = {c["name"]: c for c in result["checks"]}
    assert checks["generate"]["passed"]  # the server answers ...
    assert not checks["parity"]["passed"] and result["parity"]["mismatches"] > 0  # ... but not what the model says


def test_a_killed_serve_leaves_a_serving_dir_that_the_next_serve_removes(example_repo: Path, tmp_path: Path) -> None:
    """The server inherits the serving directory's lock: while it runs (even orphaned) the directory is
    live; once it is gone too, the next `serve` (or `cache gc`) removes the directory."""
    from trtpipe.serving.server import start_server
    from trtpipe.store.serving_dirs import stale_serving_dirs

    home = tmp_path / "home"
    subprocess.run(["cp", "-a", str(example_repo.parent.parent), str(home)], check=True)
    for leftover in list((home / "serving").glob("*")) if (home / "serving").exists() else []:
        subprocess.run(["rm", "-rf", str(leftover)], check=True)  # copied from a live store: not ours
    repo = home / "repository" / example_repo.name
    env = {**os.environ, "TRTPIPE_HOME": str(home)}
    proc = subprocess.Popen([sys.executable, "-m", "trtpipe.cli", "serve", str(repo), "--json"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    info = json.loads(proc.stdout.readline())
    serving_dir = Path(info["serving_dir"])
    proc.kill()  # SIGKILL: no cleanup at all; tritonserver (its own session) lives on, orphaned
    proc.wait()
    try:
        assert serving_dir.is_dir() and stale_serving_dirs(home) == []  # its server still holds the lock
    finally:
        os.killpg(info["pid"], signal.SIGKILL)  # now the server dies too (and its stubs with it)
    for region in Path("/dev/shm").glob(f"trtpipe_{proc.pid}_*"):  # what the killed stubs left behind
        region.unlink(missing_ok=True)
    deadline = time.monotonic() + 30
    while stale_serving_dirs(home) == [] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert serving_dir in stale_serving_dirs(home)
    with start_server(repo, start_timeout=180, settings=Settings.from_env()) as server:
        assert not serving_dir.exists() and server.serving_dir != serving_dir
    assert main(["cache", "verify", "--store", str(home)]) == 0
