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


def test_serve_print(repo_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`serve --print` of a GPU repository: the docker command, named after the digest and port (a repository outside
    a store: "unstored"). Running it, watched, and its refusals: tests/serving/test_serve_container.py."""
    manifest_path = repo_copy / "trtpipe.json"
    manifest = json.loads(manifest_path.read_text())
    manifest.update(reference=False, target="h100-sxm")
    manifest_path.write_text(json.dumps(manifest))
    assert main(["serve", str(repo_copy), "--print", "--grpc-port", "8101"]) == 0
    printed = shlex.split(capsys.readouterr().out.strip())
    assert printed[:2] == ["docker", "run"] and "127.0.0.1:8101:8101" in printed
    assert printed[printed.index("--name") + 1] == "trtpipe-unstored-8101"


def test_serve_print_of_a_stored_gpu_repository_mounts_a_kept_serving_dir(tmp_path: Path, tiny_llama_dir: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """A GPU host's container reads a serving directory (one per digest, kept), never the store entry;
    its configs carry the repository digest the server will report."""
    from trtpipe.resolve import resolve
    from trtpipe.serving.inflight_repository import publish_repository
    from trtpipe.spec_loader import load_spec
    from trtpipe.store.local import Store

    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(f"name: tiny-h100\nmodel:\n  path: {tiny_llama_dir}\ntarget:\n  gpu: h100-sxm\n"
                         "engine: {max_batch_size: 8, max_input_len: 256, max_seq_len: 512}\n")
    resolved = resolve(load_spec(spec_path))
    engine = tmp_path / "engine"
    engine.mkdir()
    (engine / "config.json").write_text(json.dumps({
        "version": resolved.toolchain.trtllm_version,
        "pretrained_config": {"architecture": "LlamaForCausalLM", "mapping": {"world_size": 1, "tp_size": 1, "pp_size": 1}},
        "build_config": {"max_batch_size": 8, "max_input_len": 256, "max_seq_len": 512, "max_beam_width": 1}}))
    (engine / "rank0.engine").write_bytes(b"stand-in engine" * 1000)
    store = Store.open(tmp_path / "home")
    with store.building("repository", "r" * 16) as b:
        publish_repository(resolved, engine, "sha256:" + "ab" * 32, "engine-key", b.dir, repository_key="r" * 16)
        entry = b.commit(inputs={"name": "tiny-h100"})
    for _ in range(2):  # the same kept directory both times
        assert main(["serve", str(entry.path), "--print"]) == 0
        printed = shlex.split(capsys.readouterr().out.strip())
        mount = next(arg for arg in printed if arg.endswith(":/trtpipe/repo:ro")).rsplit(":", 2)[0]
        assert Path(mount) == store.root / "serving" / f"{entry.digest.removeprefix('sha256:')[:12]}-container"
    served = Path(mount)
    assert (served / "tensorrt_llm" / "1" / "rank0.engine").stat().st_ino == (entry.path / "tensorrt_llm" / "1" / "rank0.engine").stat().st_ino
    config = (served / "tensorrt_llm" / "config.pbtxt").read_text()
    assert f'key: "trtpipe_repository_digest" value: {{ string_value: "{entry.digest}" }}' in config
    assert "trtpipe_repository_digest" not in (entry.path / "tensorrt_llm" / "config.pbtxt").read_text()
    assert (served / "ensemble" / "1").is_dir()  # Triton needs the (empty) ensemble version folder
