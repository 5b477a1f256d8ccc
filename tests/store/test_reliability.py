"""Reliability under concurrency and kills, with real `trtpipe build` processes on the tiny spec."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from trtpipe.store.local import Store

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]

STORED_KINDS = ("checkpoint", "engine", "repository")


def test_eight_concurrent_builds_build_each_stage_once(tiny_spec: Path, tmp_path: Path, tools) -> None:
    home = tmp_path / "home"
    procs = [
        subprocess.Popen(tools.trtpipe_cmd("build", str(tiny_spec), "--json"), env=tools.cli_env(home),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(8)
    ]
    outputs = [proc.communicate(timeout=800) for proc in procs]
    for proc, (out, err) in zip(procs, outputs):
        assert proc.returncode == 0, err[-2000:]
    reports = [json.loads(out) for out, _ in outputs]
    assert all(r["status"] == "ok" for r in reports)
    # Every process ends with the same artifacts ...
    assert len({json.dumps(r["artifacts"], sort_keys=True) for r in reports}) == 1
    # ... and each stage was built exactly once, by whichever process got its lock first.
    built = tools.built_lines(home)
    assert sorted(line["kind"] for line in built) == sorted(STORED_KINDS), built
    for stage in ("checkpoint", "engine", "publish"):
        assert sum(1 for r in reports for s in r["stages"] if s["name"] == stage and s["outcome"] == "built") == 1
    records = list((home / "records").glob("*.json"))
    assert len(records) == 8
    verify = tools.run_cli(home, "cache", "verify", "--json")
    assert verify.returncode == 0, verify.stdout
    assert json.loads(verify.stdout)["entries"] == 3
    assert not list((home / "tmp").iterdir())


def _kill_after(cmd: list[str], env: dict[str, str], delay: float) -> int | None:
    """Start a build, SIGKILL its whole process group after `delay` seconds. Returns its exit code if it
    finished first."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        return proc.wait(timeout=delay)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return None


def _remove_entries(home: Path, kinds: tuple[str, ...]) -> None:
    store = Store(home)
    for kind in kinds:
        for entry in list(store.entries(kind)):
            assert store.remove(entry)


def test_sigkill_at_many_points_leaves_no_partial_entry(tiny_spec: Path, tmp_path: Path, tools) -> None:
    home = tmp_path / "home"
    env = tools.cli_env(home)
    cmd = tools.trtpipe_cmd("build", str(tiny_spec))

    # A first full run tells the test how long each part takes here (no assertion on time).
    started = time.monotonic()
    assert tools.run_cli(home, "build", str(tiny_spec)).returncode == 0
    cold = time.monotonic() - started
    record = json.loads(sorted((home / "records").glob("*.json"))[-1].read_text())
    checkpoint_s = next(s["seconds"] for s in record["stages"] if s["name"] == "checkpoint")
    startup_s = max(cold - record["seconds"], 0.3)

    kill_points: list[tuple[str, float]] = []
    # Phase 1: kills while the checkpoint is converted and committed (the store is cold again each time).
    for fraction in (0.5, 1.02):  # mid-conversion, and around its commit
        kill_points.append(("checkpoint", startup_s + fraction * checkpoint_s))
    # Phase 2: the checkpoint exists; kills spread over start-up, engine and publish.
    tail_s = max(record["seconds"] - checkpoint_s, 0.2)
    for i in range(18):
        kill_points.append(("engine+publish", startup_s * 0.5 + (i / 17) * (startup_s * 0.6 + tail_s * 1.4)))

    finished_before_kill = 0
    for phase, delay in kill_points:
        _remove_entries(home, STORED_KINDS if phase == "checkpoint" else ("engine", "repository"))
        if _kill_after(cmd, env, delay) is not None:
            finished_before_kill += 1
        problems = tools.visible_entries_complete(home)
        assert not problems, (phase, delay, problems)
    assert len(kill_points) >= 20
    assert finished_before_kill < len(kill_points)  # most runs really were killed mid-way

    # The next run completes, and the store verifies clean with no leftovers after gc.
    final = tools.run_cli(home, "build", str(tiny_spec), "--json")
    assert final.returncode == 0, final.stderr
    assert json.loads(final.stdout)["status"] == "ok"
    assert tools.run_cli(home, "cache", "verify").returncode == 0
    assert tools.run_cli(home, "cache", "gc").returncode == 0
    assert not list((home / "tmp").iterdir())
    assert tools.run_cli(home, "cache", "verify").returncode == 0


STORE_WRITER = r"""
import sys, os
from pathlib import Path
from trtpipe.store.local import Store
store = Store.open(Path(sys.argv[1]))
for i in range(10_000):
    key = f"k{i % 3}"
    with store.building("engine", key, force=True) as b:
        for n in range(8):
            (b.dir / f"rank{n}.engine").write_bytes(os.urandom(64 * 1024))
        b.commit(inputs={"i": i})
"""


def test_sigkill_during_store_commits(tmp_path: Path, tools) -> None:
    """Kill a process that commits (and force-replaces) entries in a tight loop, at many random times."""
    import random

    home = tmp_path / "home"
    Store.open(home)
    env = tools.cli_env(home)
    rng = random.Random(1234)
    for _ in range(20):
        proc = subprocess.Popen([tools.trtpipe_cmd()[0], "-c", STORE_WRITER, str(home)], env=env,
                                start_new_session=True)
        time.sleep(0.4 + rng.random() * 1.2)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        problems = tools.visible_entries_complete(home)
        assert not problems, problems
    store = Store.open(home)
    with store.building("engine", "after") as b:  # the store still works, and gc cleans what kills left
        (b.dir / "x").write_bytes(b"ok")
        b.commit(inputs={})
    assert tools.run_cli(home, "cache", "gc").returncode == 0
    assert not list((home / "tmp").iterdir())
    assert not list((home / "trash").glob("*")) if (home / "trash").exists() else True
    assert tools.run_cli(home, "cache", "verify").returncode == 0
