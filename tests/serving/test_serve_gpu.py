"""GPU targets: the docker command `trtpipe serve --print` renders, and a clear refusal without a daemon."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from trtpipe.cli import main
from trtpipe.serving.server import docker_command

MANIFEST = {
    "serving_container": "nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3",
    "serving_container_digest": None,
    "container_repo_mount": "/trtpipe/repo",
    "engine": {"world_size": 2},
}


def test_docker_command_one_server_per_rank(tmp_path: Path) -> None:
    cmd = docker_command(tmp_path, MANIFEST, grpc_port=9001, http_port=9000, metrics_port=9002)
    assert cmd[:3] == ["docker", "run", "--rm"]
    assert '--gpus="device=0,1"' in cmd and "--shm-size=2g" in cmd
    assert "127.0.0.1:9001:9001" in cmd and f"{tmp_path.resolve()}:/trtpipe/repo:ro" in cmd
    assert MANIFEST["serving_container"] in cmd
    mpi = cmd[cmd.index("mpirun"):]
    assert mpi.count("-n") == 2 and mpi.count(":") == 1
    rank1 = mpi[mpi.index(":") + 1:]
    assert "--model-control-mode=explicit" in rank1 and "--load-model=tensorrt_llm" in rank1
    assert "--backend-config=python,shm-region-prefix-name=prefix1_" in rank1
    assert "--grpc-port=9001" in mpi


def test_single_rank_has_no_mpirun(tmp_path: Path) -> None:
    cmd = docker_command(tmp_path, {**MANIFEST, "engine": {"world_size": 1}})
    assert "mpirun" not in cmd and '--gpus="device=0"' in cmd


def test_serve_print_and_no_daemon(repo_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifest_path = repo_copy / "trtpipe.json"
    manifest = json.loads(manifest_path.read_text())
    manifest.update(reference=False, target="h100-sxm")
    manifest_path.write_text(json.dumps(manifest))
    assert main(["serve", str(repo_copy), "--print", "--grpc-port", "8101"]) == 0
    printed = shlex.split(capsys.readouterr().out.strip())
    assert printed[:2] == ["docker", "run"] and "127.0.0.1:8101:8101" in printed
    # No Docker daemon on this host: one line, exit 3 (MissingCapability).
    code = main(["serve", str(repo_copy)])
    err = capsys.readouterr().err.strip()
    if code == 0:
        pytest.skip("a Docker daemon is reachable here")
    assert code == 3 and len(err.splitlines()) == 1 and "Docker daemon" in err
