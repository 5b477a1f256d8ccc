"""`trtpipe matrix build` as a user runs it: the embedded local Ray (build, then all hits), and Ctrl-C on a
cluster (every task cancelled, what finished said, nothing partial in the registry)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from .conftest import RayTestCluster, registry_problems, write_matrix

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(900)

ONE_CELL = """\
name: one
base:
  engine: {max_batch_size: 4, max_input_len: 64, max_seq_len: 128}
  toolchain: trtllm-1.2.1
axes:
  models: [{label: llama, path: %(llama)s, dtype: float16}]
  targets: [cpu-reference]
  quantizations: [none]
include:
  - model: {label: llama3-8b, config: %(config)s, dtype: bfloat16}
    target: h100-sxm
    quantization: fp8
"""


def _env(home: Path, tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRTPIPE_", "RAY_"))}
    env.update(TRTPIPE_HOME=str(home), HOME=str(tmp_path), PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", **extra)
    env.pop("DOCKER_CONFIG", None)
    return env


def _matrix(*args: str, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trtpipe.cli", "matrix", *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_embedded_local_ray_builds_the_cpu_cells_plans_the_gpu_ones_then_all_hits(
        tiny_llama_dir: Path, tmp_path: Path) -> None:
    matrix = write_matrix(tmp_path, ONE_CELL % {"llama": tiny_llama_dir,
                                                "config": ROOT / "build_configs/models/llama-3-8b/config.json"})
    env = _env(tmp_path / "home", tmp_path)
    # Another cluster this machine knows of (nothing listens there): the embedded default starts its own
    # instance rather than joining it (Ray's ray.init() without an address would join it and fail).
    first = _matrix("build", str(matrix), "--json", env={**env, "RAY_ADDRESS": "127.0.0.1:9"})
    assert first.returncode == 0, first.stderr[-3000:]
    report = json.loads(first.stdout)
    assert report["ray"] == "embedded local Ray" and report["tasks"] == 1
    assert report["counts"]["built"] == 1 and report["counts"]["planned"] == 1
    cpu, gpu = report["cells"]
    assert cpu["outcome"] == "built" and cpu["where"] == "worker" and cpu["artifacts"]["repository"].startswith("sha256:")
    assert gpu["outcome"] == "planned" and gpu["where"] == "head"
    assert next(s for s in gpu["stages"] if s["name"] == "engine")["command"][0] == "trtllm-build"

    second = _matrix("build", str(matrix), env=env)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "0 tasks on no cluster: none needed" in second.stdout
    assert "0 built, 1 hit, 0 failed, 0 refused, 1 planned" in second.stdout
    assert cpu["artifacts"]["repository"] in second.stdout


SLOW = """\
name: slow
base:
  engine: {max_batch_size: 4, max_input_len: 64, max_seq_len: 128}
axes:
  models:
    - {label: llama, path: %(llama)s, dtype: float16}
    - {label: qwen2, path: %(qwen2)s, dtype: float16}
  targets: [cpu-reference]
  quantizations:
    - {label: awq-g32, algo: int4_awq, group_size: 32, calibration: {samples: 24}}
    - {label: fp8-s20, algo: fp8, calibration: {samples: 20}}
"""


def test_ctrl_c_cancels_every_task_and_says_what_finished(ray_cluster: RayTestCluster, registry: Any,
                                                          tiny_llama_dir: Path, tiny_qwen2_dir: Path,
                                                          tmp_path: Path) -> None:
    matrix = write_matrix(tmp_path, SLOW % {"llama": tiny_llama_dir, "qwen2": tiny_qwen2_dir})
    env = _env(tmp_path / "home", tmp_path, TRTPIPE_REGISTRY_USERNAME=registry.username,
               TRTPIPE_REGISTRY_PASSWORD=registry.password)
    proc = subprocess.Popen([sys.executable, "-m", "trtpipe.cli", "matrix", "build", str(matrix), "--ray",
                             ray_cluster.address, "--store", registry.url("matrix/ctrl-c")],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    stdout: list[str] = []
    running = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if " running " in line:
                running.set()

    def read_stdout() -> None:
        assert proc.stdout is not None
        stdout.append(proc.stdout.read())

    # One reader per pipe, each to its end: proc.communicate() would read stderr too, beside this reader, and the
    # lines it took (the closing "interrupted:" line among them) would be lost to the assertions below.
    reader = threading.Thread(target=read, daemon=True)
    out_reader = threading.Thread(target=read_stdout, daemon=True)
    reader.start()
    out_reader.start()
    try:
        # Deadlines for a loaded machine (a CI run that took 81 minutes failed this test): the first task may take
        # minutes to start, and cancelling every task out goes through Ray; neither wait ends early on success.
        assert running.wait(420), "".join(lines)[-3000:]
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=360)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(60)
    out_reader.join(60)
    assert not reader.is_alive() and not out_reader.is_alive(), "a pipe was still open a minute after the exit"
    out = "".join(stdout)
    err = "".join(lines)
    assert proc.returncode == 130, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("interrupted: every task still out was cancelled; nothing partial is in the shared store")
    assert "finished: " in last
    assert "cancelled" in out  # the summary table names each cancelled cell
    assert registry_problems(registry, "matrix/ctrl-c", tmp_path / "check") == []
