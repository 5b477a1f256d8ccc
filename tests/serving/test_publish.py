"""publish_repository for a GPU target (a stand-in engine dir: no TensorRT here) and for streaming: false."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from trtpipe.errors import TrtpipeError
from trtpipe.serving.inflight_repository import publish_repository
from trtpipe.serving.validate import errors_only, validate_repository


def _resolve(spec_text: str, spec_dir: Path):
    from trtpipe.resolve import resolve
    from trtpipe.spec_loader import load_spec

    spec_dir.mkdir(parents=True, exist_ok=True)
    path = spec_dir / "spec.yaml"
    path.write_text(spec_text)
    return resolve(load_spec(path))


def _gpu_engine(dir_: Path, *, tp: int, max_batch_size: int, version: str) -> Path:
    """The files a trtllm-build engine dir has (config.json + rank{N}.engine); the engines are stand-ins."""
    dir_.mkdir(parents=True)
    config = {
        "version": version,
        "pretrained_config": {"architecture": "LlamaForCausalLM", "mapping": {"world_size": tp, "tp_size": tp, "pp_size": 1}},
        "build_config": {"max_batch_size": max_batch_size, "max_input_len": 256, "max_seq_len": 512, "max_beam_width": 1},
    }
    (dir_ / "config.json").write_text(json.dumps(config))
    for rank in range(tp):
        (dir_ / f"rank{rank}.engine").write_bytes(b"stand-in engine")
    return dir_


GPU_SPEC = """\
name: tiny-h100
model:
  path: {model}
  dtype: float16
target:
  gpu: h100-sxm
  tp: 2
engine:
  max_batch_size: 8
  max_input_len: 256
  max_seq_len: 512
triton:
  streaming: {streaming}
  max_batch_size: {triton_batch}
toolchain: trtllm-1.2.1
"""


def test_publish_gpu_repository(tmp_path: Path, tiny_llama_dir: Path) -> None:
    resolved = _resolve(GPU_SPEC.format(model=tiny_llama_dir, streaming="true", triton_batch=8), tmp_path / "spec")
    engine = _gpu_engine(tmp_path / "engine", tp=2, max_batch_size=8, version=resolved.toolchain.trtllm_version)
    repo = publish_repository(resolved, engine, "sha256:" + "ab" * 32, "engine-key", tmp_path / "repo")
    assert errors_only(validate_repository(repo)) == []
    config = (repo / "tensorrt_llm" / "config.pbtxt").read_text()
    assert 'backend: "tensorrtllm"' in config and "decoupled: true" in config
    assert '"/trtpipe/repo/tensorrt_llm/1"' in config and '"0,1"' in config
    assert (repo / "tensorrt_llm" / "1" / "rank1.engine").stat().st_ino == (engine / "rank1.engine").stat().st_ino
    assert not (repo / "tensorrt_llm" / "1" / "model.py").exists()
    manifest = json.loads((repo / "trtpipe.json").read_text())
    assert manifest["serving_container"] == resolved.toolchain.triton_container
    # The link is checked above; how files were placed is not part of the content (nor its digest).
    assert manifest["engine"]["world_size"] == 2 and "placement" not in manifest["engine"]
    # A missing rank is caught.
    (repo / "tensorrt_llm" / "1" / "rank1.engine").unlink()
    assert any(i.field == "1/rank1.engine" for i in validate_repository(repo))


def test_publish_refuses_batch_above_the_engine(tmp_path: Path, tiny_llama_dir: Path) -> None:
    resolved = _resolve(GPU_SPEC.format(model=tiny_llama_dir, streaming="true", triton_batch=8), tmp_path / "spec")
    engine = _gpu_engine(tmp_path / "engine", tp=2, max_batch_size=4, version=resolved.toolchain.trtllm_version)
    with pytest.raises(TrtpipeError, match=r"triton.max_batch_size 8 exceeds the engine's max_batch_size 4"):
        publish_repository(resolved, engine, "sha256:" + "ab" * 32, "engine-key", tmp_path / "repo")
    assert not (tmp_path / "repo").exists()  # nothing half-written
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".repo")] == []


def test_publish_non_streaming(tmp_path: Path, tiny_llama_dir: Path) -> None:
    resolved = _resolve(GPU_SPEC.format(model=tiny_llama_dir, streaming="false", triton_batch=4), tmp_path / "spec")
    engine = _gpu_engine(tmp_path / "engine", tp=2, max_batch_size=8, version=resolved.toolchain.trtllm_version)
    repo = publish_repository(resolved, engine, "sha256:" + "ab" * 32, "engine-key", tmp_path / "repo")
    assert errors_only(validate_repository(repo)) == []
    assert "decoupled: false" in (repo / "tensorrt_llm" / "config.pbtxt").read_text()
    assert "max_batch_size: 4" in (repo / "ensemble" / "config.pbtxt").read_text()


def test_publish_refuses_a_tokenizer_without_tokenizer_json(tmp_path: Path, tiny_llama_dir: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_llama_dir, model)
    resolved = _resolve(GPU_SPEC.format(model=model, streaming="true", triton_batch=8), tmp_path / "spec")
    (model / "tokenizer.json").unlink()  # after resolving: resolve refuses a build without it too
    engine = _gpu_engine(tmp_path / "engine", tp=2, max_batch_size=8, version=resolved.toolchain.trtllm_version)
    with pytest.raises(TrtpipeError, match="no tokenizer.json"):
        publish_repository(resolved, engine, "sha256:" + "ab" * 32, "engine-key", tmp_path / "repo")
