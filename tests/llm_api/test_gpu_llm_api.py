"""The LLM-API track on a real GPU host (skipped elsewhere, with the reason).

1. TensorRT-LLM's own TorchLlmArgs takes every llm_args.json trtpipe writes, and the 1.2.1 table names exactly
   the fields the installed class has (the table was read from an index copy, not the v1.2.1 tag: this is the
   check that closes that gap on a host with TensorRT-LLM 1.2.1).
2. `tensorrt_llm.LLM(model=<artifact>, **llm_args)` loads the exported FP8 + FP8 KV tiny Llama on the GPU and its
   greedy tokens equal the CPU reference runtime's on the same artifact for the first tokens (the reference
   simulates the same roundings; exact token equality over a short horizon is what parity asks of engines too).
3. The export in the executor on the GPU (device cuda) keeps the CPU export's FP8 weights bit for bit.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from trtpipe.checkpoint.hf_export import LLM_ARGS_FILE, export_hf_artifact
from trtpipe.llm_api.args import load_args_table
from trtpipe.resolve import resolve
from trtpipe.spec_loader import load_spec


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


NO_TRTLLM = "tensorrt_llm is not installed (GPU hosts with TensorRT-LLM 1.2.1 only)" \
    if importlib.util.find_spec("tensorrt_llm") is None else ""
NO_CUDA = "" if _cuda() else "no CUDA device visible to torch"


@pytest.mark.gpu
@pytest.mark.skipif(bool(NO_TRTLLM), reason=NO_TRTLLM or "ready")
def test_the_installed_torchllmargs_has_exactly_the_tables_fields() -> None:
    from tensorrt_llm.llmapi import TorchLlmArgs
    import tensorrt_llm

    table = load_args_table("trtllm-1.2.1")
    if tensorrt_llm.__version__ != table.trtllm_version:
        pytest.skip(f"TensorRT-LLM {tensorrt_llm.__version__} installed, the table is {table.trtllm_version}'s")
    assert set(TorchLlmArgs.model_fields) == set(table.fields)


@pytest.mark.gpu
@pytest.mark.skipif(bool(NO_TRTLLM or NO_CUDA), reason=NO_TRTLLM or NO_CUDA or "ready")
def test_llm_loads_the_artifact_with_its_arguments_and_agrees_with_the_reference(tiny_spec, export_spec,
                                                                                 tmp_path) -> None:
    from tensorrt_llm import LLM, SamplingParams
    from tensorrt_llm.llmapi import TorchLlmArgs

    folder = export_spec(tiny_spec(algo="fp8", kv_cache="fp8"), tmp_path / "artifact")
    args = json.loads((folder / LLM_ARGS_FILE).read_text())
    TorchLlmArgs(model=str(folder), **args)  # the release's own validation
    llm = LLM(model=str(folder), **args)
    try:
        out = llm.generate(["Once upon a time"], SamplingParams(max_tokens=8, temperature=0.0))[0]
        tokens = list(out.outputs[0].token_ids)
    finally:
        llm.shutdown()
    from trtpipe.reference.runtime import ReferenceModel

    # ReferenceModel.load reads the HF-format artifact (trtpipe.reference.hf_loader)
    reference = ReferenceModel.load(folder)
    prompt_ids = llm.tokenizer.encode("Once upon a time")
    greedy = [t.token_id for t in reference.generate(prompt_ids, max_new_tokens=8)]
    assert tokens[:4] == greedy[:4]


@pytest.mark.gpu
@pytest.mark.skipif(bool(NO_CUDA), reason=NO_CUDA or "ready")
def test_a_gpu_export_keeps_the_cpu_exports_fp8_weights(tiny_spec, tmp_path) -> None:
    import torch
    from safetensors.torch import load_file

    spec = tiny_spec(algo="fp8")
    cpu, gpu = tmp_path / "cpu", tmp_path / "gpu"
    cpu.mkdir(), gpu.mkdir()
    export_hf_artifact(resolve(load_spec(spec)), cpu)
    export_hf_artifact(resolve(load_spec(spec)), gpu, device="cuda")
    a, b = load_file(cpu / "model.safetensors"), load_file(gpu / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        if name.endswith(".weight") and a[name].dtype.itemsize == 1:
            assert a[name].view(torch.uint8).equal(b[name].view(torch.uint8)), name
    assert json.loads((cpu / LLM_ARGS_FILE).read_text()) == json.loads((gpu / LLM_ARGS_FILE).read_text())
    assert Path(cpu / "hf_quant_config.json").read_bytes() == Path(gpu / "hf_quant_config.json").read_bytes()
