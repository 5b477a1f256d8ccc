"""GPU hosts: the llmapi repository on TensorRT-LLM's PyTorch backend (skipped here, with the reason).

- test_llm_api_matches_the_reference: the artifact's model.yaml arguments handed to `tensorrt_llm.LLM` as
  upstream's model.py hands them (every key but triton_config), greedy text against the CPU reference runtime on a
  fresh export. Needs a GPU and tensorrt_llm >= 1.2.1 importable.
- test_llmapi_repository_in_the_pinned_container: `serve`'s start_server runs the toolchain's Triton TRT-LLM container
  on the published GPU repository (the command `serve --print` shows) as a watched child, waits for it and checks
  the digest it reports, then smoke with parity passes against it. Needs a GPU, a Docker daemon with the NVIDIA
  runtime, and the container image (pulled beforehand).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from trtpipe.settings import Settings


def _gpus() -> list:
    from trtpipe.gpu import probe_host

    try:
        return probe_host().gpus
    except Exception:
        return []


def _missing_llm_api() -> str:
    missing = [] if _gpus() else ["no NVIDIA GPU (NVML sees none)"]
    try:
        import tensorrt_llm  # noqa: F401
    except Exception:
        missing.append("tensorrt_llm is not importable (pip install tensorrt-llm==1.2.1 from NVIDIA's index)")
    return "; ".join(missing)


def _missing_container() -> str:
    missing = [] if _gpus() else ["no NVIDIA GPU (NVML sees none)"]
    try:
        import docker

        docker.from_env().ping()
    except Exception:
        missing.append("no Docker daemon reachable")
    return "; ".join(missing)


LLM_API_MISSING = _missing_llm_api()
CONTAINER_MISSING = _missing_container()
PROMPTS = ["Once upon a time", "The cat sat on the", "In the beginning"]
MAX_TOKENS = 16


def _resolved(tmp_path: Path, model_dir: Path, gpu: str):
    from trtpipe.resolve import resolve
    from trtpipe.spec_loader import load_spec

    spec = tmp_path / "spec.yaml"
    spec.write_text(f"name: tiny-llmapi-gpu\nmodel: {{path: {json.dumps(str(model_dir))}, dtype: float16}}\n"
                    f"target: {{gpu: {gpu}}}\ntriton: {{streaming: true}}\n")
    return resolve(load_spec(spec))


def _catalog_gpu() -> str:
    from trtpipe.gpu import catalog_entry_for

    entry = catalog_entry_for(_gpus()[0])
    if entry is None:
        pytest.skip("this host's GPU is not in the catalog")
    return entry.name


@pytest.mark.gpu
@pytest.mark.timeout(1800)
@pytest.mark.skipif(bool(LLM_API_MISSING), reason=LLM_API_MISSING or "ready")
def test_llm_api_matches_the_reference(tmp_path: Path, tiny_llama_dir: Path, llmapi_artifact, export_llmapi) -> None:
    from tensorrt_llm import LLM, SamplingParams

    from trtpipe.serving.llmapi_repository import publish_llmapi_repository
    from trtpipe.reference.parity import ParityReference
    from trtpipe.serving.smoke import reference_llmapi_greedy

    artifact = llmapi_artifact("llama", "none", "auto")
    repo = publish_llmapi_repository(_resolved(tmp_path, tiny_llama_dir, _catalog_gpu()), artifact,
                                     "sha256:" + "3" * 64, tmp_path / "repo")
    args = yaml.safe_load((repo / "tensorrt_llm/1/model.yaml").read_text())
    args.pop("triton_config")
    args["model"] = str(repo / "tensorrt_llm/1/checkpoint")  # the host path of what the container mounts
    llm = LLM(**args)
    try:
        outputs = llm.generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS, top_k=1))
        got = [o.outputs[0].text for o in outputs]
    finally:
        llm.shutdown()
    fresh = export_llmapi(tiny_llama_dir, tmp_path / "fresh", algo="none")
    assert got == reference_llmapi_greedy(ParityReference(engine_dir=fresh, tokenizer_dir=fresh), PROMPTS, MAX_TOKENS)


@pytest.mark.gpu
@pytest.mark.docker
@pytest.mark.timeout(3600)
@pytest.mark.skipif(bool(CONTAINER_MISSING), reason=CONTAINER_MISSING or "ready")
def test_llmapi_repository_in_the_pinned_container(tmp_path: Path, tiny_llama_dir: Path, llmapi_artifact,
                                                   export_llmapi) -> None:
    from trtpipe.serving.llmapi_repository import publish_llmapi_repository
    from trtpipe.serving.server import start_server
    from trtpipe.serving.smoke import run_smoke

    artifact = llmapi_artifact("llama", "none", "auto")
    repo = publish_llmapi_repository(_resolved(tmp_path, tiny_llama_dir, _catalog_gpu()), artifact,
                                     "sha256:" + "4" * 64, tmp_path / "repo")
    fresh = export_llmapi(tiny_llama_dir, tmp_path / "fresh", algo="none")
    # The container command `serve --print` shows, run and watched as `serve` runs it (trtpipe.serving.container):
    # the container pulls nothing, but loads the LLM, which takes minutes.
    with start_server(repo, grpc_port=18001, http_port=18000, metrics_port=18002, start_timeout=1200, settings=Settings.from_env()) as server:
        assert server.image == json.loads((repo / "trtpipe.json").read_text())["serving_container"]
        result = run_smoke(server.grpc_url, parity_engine=(fresh, fresh), max_tokens=MAX_TOKENS, timeout=300)
        assert result.passed, result
