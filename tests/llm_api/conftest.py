"""LLM-API artifacts of the tiny example models, exported once per session with the real ModelOpt, and spec
files for the llm-api rules."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from trtpipe.checkpoint.hf_export import export_hf_artifact
from trtpipe.resolve import resolve
from trtpipe.spec_loader import load_spec
from trtpipe.shipped import shipped_build_configs_dir

MODELS = shipped_build_configs_dir() / "models"


def llm_api_spec(model_dir: Path, *, algo: str = "none", kv_cache: str = "auto", tp: int = 1, pp: int = 1,
                 backend: str = "llm-api", **extra: object) -> dict:
    """A cpu-reference spec of the tiny model (small calibration: 4 windows of 64 tokens)."""
    spec: dict = {
        "name": "tiny-llmapi",
        "model": {"path": str(model_dir), "dtype": "float16"},
        "target": {"gpu": "cpu-reference", "tp": tp, "pp": pp},
        "quantization": {"algo": algo, "kv_cache": kv_cache, "calibration": {"samples": 4, "max_seq_len": 64}},
        "engine": {"max_batch_size": 4, "max_input_len": 64, "max_seq_len": 128},
        "backend": backend,
    }
    for key, value in extra.items():
        spec[key] = value
    return spec


def write_spec(path: Path, spec: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return path


def export(spec_path: Path, out: Path) -> Path:
    out.mkdir(parents=True)
    export_hf_artifact(resolve(load_spec(spec_path)), out)
    return out


@pytest.fixture(scope="session")
def exported(tiny_llama_dir: Path, tiny_qwen2_dir: Path,
             tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """exported(arch, algo, kv_cache="auto") -> the artifact folder (made once per recipe)."""
    root = tmp_path_factory.mktemp("llmapi-artifacts")
    models = {"llama": tiny_llama_dir, "qwen2": tiny_qwen2_dir}
    made: dict[tuple[str, str, str], Path] = {}

    def make(arch: str, algo: str, kv_cache: str = "auto") -> Path:
        key = (arch, algo, kv_cache)
        if key not in made:
            name = f"{arch}-{algo}-{kv_cache}"
            spec = write_spec(root / f"{name}.yaml", llm_api_spec(models[arch], algo=algo, kv_cache=kv_cache))
            made[key] = export(spec, root / name)
        return made[key]

    return make


@pytest.fixture
def gpu_spec(tmp_path: Path) -> Callable[..., Path]:
    """gpu_spec(model_name, gpu, **sections) -> a planning-only spec (model.config) for a GPU target."""

    def make(model_name: str = "llama-3-8b", gpu: str = "h100-sxm", **sections: object) -> Path:
        spec: dict = {"name": "gpu-llmapi", "model": {"config": str(MODELS / model_name / "config.json")},
                      "target": {"gpu": gpu}, "backend": "llm-api"}
        for key, value in sections.items():
            if isinstance(value, dict) and isinstance(spec.get(key), dict):
                spec[key] = {**spec[key], **value}
            else:
                spec[key] = value
        return write_spec(tmp_path / f"spec-{len(list(tmp_path.glob('spec-*.yaml')))}.yaml", spec)

    return make


@pytest.fixture
def tiny_spec(tmp_path: Path, tiny_llama_dir: Path) -> Callable[..., Path]:
    """tiny_spec(**llm_api_spec keywords) -> a spec file of the tiny Llama on cpu-reference (backend llm-api)."""

    def make(model_dir: Path | None = None, **recipe: object) -> Path:
        count = len(list(tmp_path.glob("tiny-*.yaml")))
        return write_spec(tmp_path / f"tiny-{count}.yaml", llm_api_spec(model_dir or tiny_llama_dir, **recipe))

    return make


@pytest.fixture
def export_spec() -> Callable[[Path, Path], Path]:
    """export_spec(spec file, new folder) -> the folder holding the spec's LLM-API artifact."""
    return export
