"""Real engine builds of the tiny model through the local and docker executors (GPU hosts only).

Skipped here with the reason: no `trtllm-build` on PATH / no GPU / no Docker daemon. On a GPU host
with the pinned toolchain (or its container) these build, validate and load a real engine.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from trtpipe.engine.plan import make_build_plan
from trtpipe.engine.stage import build_engine

from .conftest import resolve_text


def _host_gpus():
    from trtpipe.gpu import probe_host

    try:
        return probe_host().gpus
    except Exception:
        return []


def _docker_ok() -> bool:
    try:
        from trtpipe.engine.executors.docker import connect

        connect()
        return True
    except Exception:
        return False


GPUS = _host_gpus()


def _missing(*, binary: bool = False, daemon: bool = False) -> str:
    missing = []
    if binary and shutil.which("trtllm-build") is None:
        missing.append("no trtllm-build on PATH")
    if not GPUS:
        missing.append("no NVIDIA GPU (NVML sees none)")
    if daemon and not _docker_ok():
        missing.append("no Docker daemon reachable")
    return "; ".join(missing)


LOCAL_MISSING = _missing(binary=True)
DOCKER_MISSING = _missing(daemon=True)


def _catalog_name_for_host() -> str | None:
    from trtpipe.gpu import catalog_entry_for

    if not GPUS:
        return None
    entry = catalog_entry_for(GPUS[0])
    return entry.name if entry else None


@pytest.fixture(scope="module")
def tiny_gpu_checkpoint(tmp_path_factory, tiny_llama_dir):
    gpu_name = _catalog_name_for_host()
    if gpu_name is None:
        pytest.skip("this host's GPU is not in the catalog")
    from trtpipe.checkpoint.convert import convert_checkpoint

    work = tmp_path_factory.mktemp("tiny-gpu")
    resolved = resolve_text(
        work,
        f"model:\n  path: {tiny_llama_dir}\n  dtype: float16\ntarget:\n  gpu: {gpu_name}\n  executor: local\n"
        "engine:\n  max_batch_size: 4\n  max_input_len: 64\n  max_seq_len: 128\n",
    )
    ckpt = work / "ckpt"
    ckpt.mkdir()
    convert_checkpoint(resolved, ckpt)
    return resolved, ckpt, work


@pytest.mark.gpu
@pytest.mark.timeout(1800)
@pytest.mark.skipif(bool(LOCAL_MISSING), reason=LOCAL_MISSING or "ready")
def test_real_build_local_executor(tiny_gpu_checkpoint):
    resolved, ckpt, work = tiny_gpu_checkpoint
    plan = make_build_plan(resolved)
    result = build_engine(resolved, plan, ckpt, work / "engine-local", work / "local.log")
    assert result.executor == "local"
    assert (work / "engine-local" / "rank0.engine").stat().st_size > 0
    assert result.validation.gpu_sm == resolved.gpu.sm


@pytest.mark.gpu
@pytest.mark.docker
@pytest.mark.timeout(3600)
@pytest.mark.skipif(bool(DOCKER_MISSING), reason=DOCKER_MISSING or "ready")
def test_real_build_docker_executor(tiny_gpu_checkpoint):
    resolved, ckpt, work = tiny_gpu_checkpoint
    resolved = dataclasses.replace(resolved, spec=resolved.spec.model_copy(deep=True))
    resolved.spec.target.executor = "docker"
    plan = make_build_plan(resolved)
    out = work / "engine-docker"
    out.mkdir()
    result = build_engine(resolved, plan, ckpt, out, work / "docker.log")
    assert result.executor == "docker" and result.image
    assert (Path(out) / "rank0.engine").stat().st_size > 0
