"""Every rule resolve applies for backend llm-api, each refusal one line with file:line:col, and the toolchain
rules of the LLM-API track (the preview line, the removed trtllm-build)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trtpipe.errors import TrtpipeError
from trtpipe.resolve import resolve
from trtpipe.spec_loader import load_spec
from trtpipe.toolchain import get_toolchain, load_toolchains

POSITIONED = re.compile(r"^\S+\.yaml:\d+:\d+: ")


def refusal(spec: Path) -> str:
    with pytest.raises(TrtpipeError) as info:
        resolve(load_spec(spec), need_weights=False)
    line = info.value.one_line()
    assert "\n" not in line and POSITIONED.match(line), line
    return line


def test_the_same_gpu_spec_resolves_on_both_backends(gpu_spec) -> None:
    spec = gpu_spec(quantization={"algo": "fp8", "kv_cache": "fp8"})
    assert resolve(load_spec(spec), need_weights=False).llm_api is not None
    text = spec.read_text().replace("backend: llm-api", "backend: trtllm-build")
    spec.write_text(text)
    assert resolve(load_spec(spec), need_weights=False).llm_api is None


@pytest.mark.parametrize(("algo", "says"), [
    ("int8_sq", "no INT8 SmoothQuant recipe"),
    ("w4a8_awq", "covers none, fp8 and int4_awq"),
])
def test_formats_the_llm_api_artifact_does_not_make_are_refused(gpu_spec, algo: str, says: str) -> None:
    line = refusal(gpu_spec(quantization={"algo": algo}))
    assert "quantization.algo" in line and says in line and "backend: trtllm-build" in line


def test_int4_awq_on_blackwell_is_refused_by_the_pytorch_backends_hardware_matrix(gpu_spec) -> None:
    spec = gpu_spec(gpu="b200", quantization={"algo": "int4_awq"})
    line = refusal(spec)
    assert "W4A16 AWQ" in line and "ampere, ada, hopper" in line and "b200 (blackwell)" in line
    assert "Hardware Support Matrix" in line and "quantization.md @09d4c79b" in line
    # the engine path refuses it too, by its own rule (trtllm-build's builder: no INT4 on SM >= 100)
    spec.write_text(spec.read_text().replace("backend: llm-api", "backend: trtllm-build"))
    assert "int-quant-refused-on-sm100" in refusal(spec)


def test_an_fp8_kv_cache_on_ampere_follows_each_backends_own_rule(gpu_spec) -> None:
    """The PyTorch backend's matrix lists the FP8 KV cache on Ampere; the trtllm-build path needs FP8 tensor cores."""
    spec = gpu_spec(gpu="a100-80gb", quantization={"algo": "int4_awq", "kv_cache": "fp8"})
    assert resolve(load_spec(spec), need_weights=False).llm_api.args["kv_cache_config"]["dtype"] == "fp8"
    spec.write_text(spec.read_text().replace("backend: llm-api", "backend: trtllm-build"))
    assert "quantization.kv_cache" in refusal(spec)


def test_fp8_weights_on_ampere_are_refused(gpu_spec) -> None:
    assert "fp8 tensor cores" in refusal(gpu_spec(gpu="a100-80gb", quantization={"algo": "fp8"}))


def test_a_kv_cache_dtype_the_pytorch_backend_cannot_set_is_refused(gpu_spec) -> None:
    line = refusal(gpu_spec(model={"dtype": "bfloat16"}, quantization={"kv_cache": "fp16"}))
    assert "quantization.kv_cache" in line and "auto (the weights' dtype) or fp8" in line


@pytest.mark.parametrize(("section", "value", "field"), [
    ("engine", {"plugins": {"gemm_plugin": "auto"}}, "engine.plugins"),
    ("triton", {"max_queue_delay_microseconds": 100}, "triton.max_queue_delay_microseconds"),
    ("triton", {"preprocessing_instance_count": 2}, "triton.preprocessing_instance_count"),
    ("triton", {"tensorrt_llm_instance_count": 2}, "triton.tensorrt_llm_instance_count"),
])
def test_settings_without_an_equivalent_are_refused_when_set(gpu_spec, section: str, value: dict, field: str) -> None:
    line = refusal(gpu_spec(**{section: value}))
    assert f"{field} = " in line and "no equivalent with backend llm-api" in line and f"remove {field}" in line


def test_trtllm_build_cannot_target_cpu_reference_but_llm_api_can(tiny_spec) -> None:
    assert resolve(load_spec(tiny_spec())).llm_api is not None
    assert "builds for a GPU" in refusal(tiny_spec(backend="trtllm-build"))


# ------------------------------------------------------------------------------------------- toolchains


def test_a_preview_line_is_never_the_default_nor_a_line_shorthand() -> None:
    assert get_toolchain(None).name == "trtllm-1.2.1"
    assert "trtllm-1.4.0rc4" not in load_toolchains()
    assert load_toolchains(include_preview=True)["trtllm-1.4.0rc4"].preview
    with pytest.raises(TrtpipeError) as info:
        get_toolchain("1.4")
    line = info.value.one_line()
    assert "#15763" in line and "trtllm-1.4.0rc4 (backend: llm-api, allow_preview: true)" in line


def test_a_preview_line_needs_the_explicit_opt_in(tiny_spec) -> None:
    line = refusal(tiny_spec(toolchain="trtllm-1.4.0rc4"))
    assert "toolchain" in line and "is a preview line" in line and "allow_preview: true" in line


def test_trtllm_build_on_a_line_that_removed_it_names_the_removal_and_llm_api(gpu_spec) -> None:
    spec = gpu_spec(toolchain="trtllm-1.4.0rc4", allow_preview=True, backend="trtllm-build")
    line = refusal(spec)
    for pr in ("#15763", "#15767", "#15907", "#15918"):
        assert pr in line
    assert "set backend: llm-api" in line and "trtllm-1.2.1" in line


def test_the_preview_line_builds_for_cpu_reference_only(gpu_spec, tiny_spec) -> None:
    line = refusal(gpu_spec(toolchain="trtllm-1.4.0rc4", allow_preview=True))
    assert "target.gpu" in line and "cpu-reference only" in line
    resolved = resolve(load_spec(tiny_spec(toolchain="trtllm-1.4.0rc4", allow_preview=True)))
    assert resolved.llm_api.toolchain == "trtllm-1.4.0rc4"
    assert any("max_batch_size" in n and "not seen in its source" in n for n in resolved.llm_api.notes)
