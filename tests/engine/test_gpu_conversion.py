"""Checkpoint conversion on a real GPU builder, through both executors, end to end (GPU hosts only).

Skipped here with the reason (no NVIDIA GPU; no TensorRT-LLM environment; no Docker daemon). On a GPU
host with the pinned toolchain installed (local) or its container pullable (docker), `trtpipe build`
of the tiny model for this host's GPU converts with GPU calibration in the executor, builds and
validates the engine; both executors give the same checkpoint key. Against a CPU conversion of the same
spec: the FP8 weights are bit-identical and each weight scale is within 4 float32 units in the last place
(measured on an H200 by benchmarks/gpu_conversion.py: at most 1.2e-7 relative, i.e. 1-2 ulps, see
docs/measurements/gpu-conversion-h200.json). Activation scales come from calibration forward passes in
bf16 whose reductions run in another order on the GPU; they are held to 1% (a few bf16 steps of 2^-8).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from .test_gpu_build import DOCKER_MISSING, _catalog_name_for_host
from trtpipe.settings import Settings

LOCAL_MISSING = "; ".join(m for m in [
    "no trtllm-build on PATH" if shutil.which("trtllm-build") is None else "",
    "no NVIDIA GPU (NVML sees none)" if _catalog_name_for_host() is None else "",
] if m)


def _spec(tmp_path: Path, model: Path, executor: str) -> Path:
    path = tmp_path / f"tiny-{executor}.yaml"
    path.write_text(
        f"name: tiny-gpu\nmodel: {{path: {model}, dtype: float16}}\n"
        f"target: {{gpu: {_catalog_name_for_host()}, executor: {executor}}}\n"
        "quantization: {algo: fp8, calibration: {samples: 8, max_seq_len: 64}}\n"
        "engine: {max_batch_size: 4, max_input_len: 64, max_seq_len: 128}\n",
        encoding="utf-8",
    )
    return path


def _build_on_gpu(tmp_path: Path, model: Path, executor: str, monkeypatch: pytest.MonkeyPatch):
    from trtpipe.pipeline import run_build

    home = tmp_path / f"home-{executor}"
    monkeypatch.setenv("TRTPIPE_HOME", str(home))
    report = run_build(_spec(tmp_path, model, executor), progress=False, settings=Settings.from_env())
    assert report.status == "ok", report
    from trtpipe.store.local import Store

    entry = Store.open(home).get("checkpoint", report.keys["checkpoint"])
    assert entry is not None
    return report, entry


def _cpu_checkpoint(tmp_path: Path, model: Path) -> Path:
    from trtpipe.checkpoint.convert import convert_checkpoint
    from trtpipe.resolve import resolve
    from trtpipe.spec_loader import load_spec

    out = tmp_path / "cpu"
    out.mkdir()
    convert_checkpoint(resolve(load_spec(_spec(tmp_path, model, "local"))), out)
    return out


def _same_weights_as_cpu(gpu_dir: Path, cpu_dir: Path) -> None:
    import torch
    from safetensors.torch import load_file

    gpu, cpu = load_file(str(gpu_dir / "rank0.safetensors")), load_file(str(cpu_dir / "rank0.safetensors"))
    assert gpu.keys() == cpu.keys()
    for name in gpu:
        assert gpu[name].dtype == cpu[name].dtype and gpu[name].shape == cpu[name].shape, name
        if name.endswith(".weight"):
            # FP8 weights: bit for bit (float8 has no arithmetic on the CPU: compare the bytes)
            assert gpu[name].contiguous().view(torch.uint8).equal(cpu[name].contiguous().view(torch.uint8)), name
            continue
        if not name.endswith("scaling_factor"):
            continue
        relative = ((gpu[name].float() - cpu[name].float()).abs() / cpu[name].float().abs().clamp_min(1e-30)).max()
        bound = 4 * 2.0**-23 if name.endswith("weights_scaling_factor") else 0.01
        assert float(relative) <= bound, f"{name}: {float(relative):.3g} relative, bound {bound:.3g}"


def _conversion_facts(report) -> dict:
    stage = report.stage("checkpoint")
    assert stage is not None and stage.facts is not None, report
    return stage.facts["conversion"]


@pytest.mark.gpu
@pytest.mark.timeout(3600)
@pytest.mark.skipif(bool(LOCAL_MISSING), reason=LOCAL_MISSING or "ready")
def test_local_executor_converts_on_the_gpu_and_builds(tmp_path, tiny_llama_dir, monkeypatch):
    report, entry = _build_on_gpu(tmp_path, tiny_llama_dir, "local", monkeypatch)
    conversion = _conversion_facts(report)
    assert conversion["executor"] == "local" and conversion["device"] == "cuda"
    _same_weights_as_cpu(entry.path, _cpu_checkpoint(tmp_path, tiny_llama_dir))
    assert json.loads((entry.path / "config.json").read_text())["quantization"]["quant_algo"] == "FP8"


@pytest.mark.gpu
@pytest.mark.docker
@pytest.mark.timeout(5400)
@pytest.mark.skipif(bool(DOCKER_MISSING), reason=DOCKER_MISSING or "ready")
def test_docker_executor_converts_in_the_container_on_the_gpu_and_builds(tmp_path, tiny_llama_dir, monkeypatch):
    report, entry = _build_on_gpu(tmp_path, tiny_llama_dir, "docker", monkeypatch)
    conversion = _conversion_facts(report)
    assert conversion["executor"] == "docker" and conversion["device"] == "cuda"
    assert conversion["image"]
    log = Path(conversion["log"]).read_text()
    assert "with trtpipe" in log and "from /opt/trtpipe-src/trtpipe," in log
    _same_weights_as_cpu(entry.path, _cpu_checkpoint(tmp_path, tiny_llama_dir))


@pytest.mark.gpu
@pytest.mark.docker
@pytest.mark.timeout(7200)
@pytest.mark.skipif(bool(LOCAL_MISSING or DOCKER_MISSING), reason=(LOCAL_MISSING or DOCKER_MISSING) or "ready")
def test_both_executors_give_the_same_checkpoint_key(tmp_path, tiny_llama_dir, monkeypatch):
    local, _ = _build_on_gpu(tmp_path, tiny_llama_dir, "local", monkeypatch)
    docker, _ = _build_on_gpu(tmp_path, tiny_llama_dir, "docker", monkeypatch)
    assert local.keys["checkpoint"] == docker.keys["checkpoint"]
    assert local.keys["engine"] == docker.keys["engine"]
