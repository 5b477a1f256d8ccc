"""The pinned toolchain table and the GPU catalog: complete, sourced, and refusing what they must."""

from __future__ import annotations

import re

import pytest

from trtpipe.errors import TrtpipeError
from trtpipe.gpu import find_gpu, get_gpu, load_catalog
from trtpipe.toolchain import get_toolchain, load_toolchains

FACTS = ("tensorrt_version", "cuda_version", "torch_version", "modelopt_version", "transformers_version",
         "triton_container", "min_driver")


def test_required_toolchains_are_pinned() -> None:
    toolchains = load_toolchains()
    versions = [t.trtllm_version for t in toolchains.values()]
    for required in ("0.21.0", "1.0.0", "1.1.0", "1.2.1"):
        assert required in versions


@pytest.mark.parametrize("name", list(load_toolchains()))
def test_every_known_fact_has_a_source(name: str) -> None:
    toolchain = load_toolchains()[name]
    for fact in FACTS:
        assert fact in toolchain.sources, f"{name}: no source note for {fact}"
        if getattr(toolchain, fact) is None:
            assert "unknown" in toolchain.sources[fact], f"{name}: {fact} is null but its note does not say unknown"
    if toolchain.tensorrt_version is not None:
        assert re.fullmatch(r"\d+\.\d+\.\d+\.\d+", toolchain.tensorrt_version), "TensorRT needs its full 4-part version"
    if toolchain.triton_container is not None:
        assert re.fullmatch(r"nvcr\.io/nvidia/tritonserver:\d\d\.\d\d-trtllm-python-py3", toolchain.triton_container)
    assert toolchain.sm_min <= 80 <= toolchain.sm_max


def test_newest_toolchain_is_the_default() -> None:
    assert get_toolchain(None).name == "trtllm-1.2.1"
    assert get_toolchain("1.2.1").name == get_toolchain("1.2").name == "trtllm-1.2.1"


@pytest.mark.parametrize("name", ["trtllm-1.3.0", "1.3.0rc15", "2.0.0"])
def test_toolchains_after_the_1_2_line_are_refused_with_the_reason(name: str) -> None:
    with pytest.raises(TrtpipeError, match="trtllm-build") as info:
        get_toolchain(name)
    assert "trtllm-1.2.1" in info.value.one_line()


def test_unknown_toolchain_lists_the_pinned_ones() -> None:
    with pytest.raises(TrtpipeError) as info:
        get_toolchain("banana")
    assert all(n in info.value.one_line() for n in load_toolchains())


REQUIRED_GPUS = {
    "a100-40gb": 80, "a100-80gb": 80, "a10g": 86, "l4": 89, "l40s": 89,
    "h100-sxm": 90, "h100-pcie": 90, "h100-nvl": 90, "h200": 90, "b200": 100,
}


def test_catalog_has_the_required_gpus() -> None:
    catalog = load_catalog()
    for name, sm in REQUIRED_GPUS.items():
        gpu = catalog[name]
        assert gpu.sm == sm
        assert gpu.memory_gib > 0 and gpu.memory_bandwidth_gbs > 0 and gpu.precisions and gpu.source
        assert ("fp8" in gpu.precisions) == (gpu.sm >= 89)


@pytest.mark.parametrize(
    "nvml_name,catalog_name",
    [("NVIDIA A100-SXM4-80GB", "a100-80gb"), ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
     ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA H100 PCIe", "h100-pcie"), ("NVIDIA L40S", "l40s"),
     ("NVIDIA A10G", "a10g"), ("NVIDIA H200", "h200"), ("NVIDIA B200", "b200")],
)
def test_nvml_product_strings_map_to_the_catalog(nvml_name: str, catalog_name: str) -> None:
    gpu = find_gpu(nvml_name)
    assert gpu is not None and gpu.name == catalog_name


def test_aliases_and_suggestions() -> None:
    assert get_gpu("h100").name == "h100-sxm"
    assert get_gpu("A100").name == "a100-80gb"
    with pytest.raises(TrtpipeError, match="did you mean 'l40s'"):
        get_gpu("l40")


def test_missing_data_folder_is_one_line(cli, tmp_path, monkeypatch, examples_dir) -> None:
    monkeypatch.setenv("TRTPIPE_BUILD_CONFIGS", str(tmp_path / "nowhere"))
    result = cli("plan", examples_dir / "llama3-8b-fp8-h100.yaml")
    # MissingCapability (exit 3): this installation lacks its data tables (exit 1, untyped, before issue 13)
    assert result.code == 3 and "TRTPIPE_BUILD_CONFIGS" in result.err and "Traceback" not in result.err
