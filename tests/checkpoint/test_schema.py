"""The checkpoint validator catches what a broken export would contain, naming file and tensor."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from trtpipe.checkpoint.schema import validate_checkpoint
from trtpipe.errors import TrtpipeError
from trtpipe.spec import BuildSpec

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def int4_copy(converted: Callable[..., Path], tmp_path: Path) -> Path:
    copy = tmp_path / "ck"
    shutil.copytree(converted("llama", "int4_awq", kv_cache="fp8", tp=2), copy)
    return copy


def _rewrite_rank(ckpt: Path, rank: int, edit: Callable[[dict], None]) -> None:
    path = ckpt / f"rank{rank}.safetensors"
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path))


def _spec(**quantization: object) -> BuildSpec:
    return BuildSpec.model_validate(
        {"model": {"path": "m"}, "target": {"tp": 2}, "quantization": quantization}
    )


def test_valid_checkpoint_passes_with_its_spec(int4_copy: Path) -> None:
    validate_checkpoint(int4_copy, _spec(algo="int4_awq", kv_cache="fp8"))


def test_missing_tensor_is_named(int4_copy: Path) -> None:
    _rewrite_rank(int4_copy, 1, lambda t: t.pop("transformer.layers.1.mlp.proj.weights_scaling_factor"))
    with pytest.raises(TrtpipeError, match=r"rank1\.safetensors: tensor transformer\.layers\.1\.mlp\.proj\.weights_scaling_factor is missing"):
        validate_checkpoint(int4_copy)


def test_wrong_dtype_is_named(int4_copy: Path) -> None:
    import torch

    def to_half(t: dict) -> None:
        t["transformer.layers.0.attention.qkv.weight"] = t["transformer.layers.0.attention.qkv.weight"].to(torch.float16)

    _rewrite_rank(int4_copy, 0, to_half)
    with pytest.raises(TrtpipeError, match=r"attention\.qkv\.weight has dtype F16, expected I8"):
        validate_checkpoint(int4_copy)


def test_wrong_shape_is_named(int4_copy: Path) -> None:
    def unpacked(t: dict) -> None:  # int4 stored one value per byte: [out, in] instead of [out/2, in]
        w = t["transformer.layers.0.mlp.fc.weight"]
        t["transformer.layers.0.mlp.fc.weight"] = w.repeat(2, 1)

    _rewrite_rank(int4_copy, 0, unpacked)
    with pytest.raises(TrtpipeError, match=r"mlp\.fc\.weight has shape \[256, 256\], expected \[128, 256\]"):
        validate_checkpoint(int4_copy)


def test_unexpected_tensor_is_named(int4_copy: Path) -> None:
    import torch

    _rewrite_rank(int4_copy, 0, lambda t: t.update({"transformer.layers.0.mlp.up.weight": torch.zeros(2)}))
    with pytest.raises(TrtpipeError, match=r"unexpected tensor transformer\.layers\.0\.mlp\.up\.weight"):
        validate_checkpoint(int4_copy)


def test_missing_rank_file(int4_copy: Path) -> None:
    (int4_copy / "rank1.safetensors").unlink()
    with pytest.raises(TrtpipeError, match="world_size 2"):
        validate_checkpoint(int4_copy)


def test_config_against_spec(int4_copy: Path) -> None:
    with pytest.raises(TrtpipeError, match="quant_algo W4A16_AWQ but the spec asks FP8"):
        validate_checkpoint(int4_copy, _spec(algo="fp8", kv_cache="fp8"))
    with pytest.raises(TrtpipeError, match="group_size 128 but the spec asks 64"):
        validate_checkpoint(int4_copy, _spec(algo="int4_awq", kv_cache="fp8", group_size=64))
    with pytest.raises(TrtpipeError, match="kv_cache_quant_algo FP8 but the spec asks None"):
        validate_checkpoint(int4_copy, _spec(algo="int4_awq"))


def test_qwen2_without_qwen_type_is_refused(converted: Callable[..., Path], tmp_path: Path) -> None:
    copy = tmp_path / "qwen"
    shutil.copytree(converted("qwen2", "none"), copy)
    config = json.loads((copy / "config.json").read_text())
    del config["qwen_type"]
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(TrtpipeError, match="qwen_type"):
        validate_checkpoint(copy)
