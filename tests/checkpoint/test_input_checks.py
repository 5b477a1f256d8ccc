"""Refusals: each fails in one line, names the cause and the fix, and happens before any calibration.

The spec's rules (recipe, architecture, tokenizer, tp/pp, group size, calibration file) are refused by
trtpipe.resolve, which the conversion runs first; the model directory's own checks (weights, shapes) by
the converter's inspection of it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from trtpipe.checkpoint.convert import check_versions
from trtpipe.checkpoint.hf_source import inspect_source
from trtpipe.checkpoint.recipes import convert_local
from trtpipe.errors import TrtpipeError
from trtpipe.resolve import gemm_input_widths

pytestmark = pytest.mark.timeout(300)


def _copy_model(src: Path, dst: Path, skip: tuple[str, ...] = ()) -> Path:
    dst.mkdir()
    for path in src.iterdir():
        if path.name not in skip:
            shutil.copy2(path, dst / path.name)
    return dst


def _edit_config(model: Path, **changes: object) -> None:
    config = json.loads((model / "config.json").read_text())
    config.update(changes)
    (model / "config.json").write_text(json.dumps(config))


def _refused(model: Path, out: Path, match: str, **recipe: object) -> TrtpipeError:
    with pytest.raises(TrtpipeError, match=match) as caught:
        convert_local(model, out, **recipe)
    assert "\n" not in caught.value.one_line()
    assert not out.exists(), "a refused conversion must leave nothing behind"
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")], "temp dir left behind"
    return caught.value


def test_int8_weight_only_is_refused_with_the_reason(tiny_llama_dir: Path, tmp_path: Path) -> None:
    err = _refused(tiny_llama_dir, tmp_path / "ck", "no INT8 weight-only", algo="int8_wo")
    assert "int8_sq" in err.one_line()  # the fix names an alternative


def test_pickle_weights_are_refused_unless_allowed(tiny_llama_dir: Path, tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file

    model = _copy_model(tiny_llama_dir, tmp_path / "pickled", skip=("model.safetensors",))
    torch.save(load_file(str(tiny_llama_dir / "model.safetensors")), model / "pytorch_model.bin")
    _refused(model, tmp_path / "ck", "pickle", algo="none")
    source = inspect_source(model, None, allow_pickle=True)  # the explicit flag lets it through
    assert source.uses_pickle and source.weight_files == (model / "pytorch_model.bin",)


def test_config_without_weights(tiny_llama_dir: Path, tmp_path: Path) -> None:
    model = _copy_model(tiny_llama_dir, tmp_path / "noweights", skip=("model.safetensors",))
    with pytest.raises(TrtpipeError, match="safetensors"):
        convert_local(model, tmp_path / "ck", algo="none")


def test_shape_mismatch_names_the_tensor(tiny_llama_dir: Path, tmp_path: Path) -> None:
    model = _copy_model(tiny_llama_dir, tmp_path / "mismatch")
    _edit_config(model, intermediate_size=384)
    _refused(model, tmp_path / "ck", r"model\.layers\.0\.mlp\.gate_proj\.weight has shape \[512, 256\]", algo="none")


def test_missing_tokenizer(tiny_llama_dir: Path, tmp_path: Path) -> None:
    model = _copy_model(
        tiny_llama_dir, tmp_path / "notok", skip=("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
    )
    _refused(model, tmp_path / "ck", "no tokenizer", algo="none")


def test_unsupported_architecture_lists_the_supported(tiny_llama_dir: Path, tmp_path: Path) -> None:
    model = _copy_model(tiny_llama_dir, tmp_path / "gptneox")
    _edit_config(model, architectures=["GPTNeoXForCausalLM"])
    err = _refused(model, tmp_path / "ck", "GPTNeoXForCausalLM is not supported", algo="none")
    for arch in ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"):
        assert arch in err.one_line()


def test_group_size_must_divide_every_input_width_before_calibrating(tiny_llama_dir: Path, tmp_path: Path) -> None:
    # tp=4 leaves attention.dense an input of 4*64/4 = 64 per rank: group 128 cannot divide it.
    err = _refused(tiny_llama_dir, tmp_path / "ck", "group_size 128 does not divide the input width 64", algo="int4_awq", tp=4)
    assert "attention.dense" in err.one_line()
    widths = gemm_input_widths(json.loads((tiny_llama_dir / "config.json").read_text()), tp=4)
    assert all(width % 64 == 0 for width in widths.values())  # 64 does, and the error says so
    assert "use group_size 32 or 64" in err.one_line()


def test_fp8_kv_cache_only_on_supported_recipes(tiny_llama_dir: Path, tmp_path: Path) -> None:
    _refused(tiny_llama_dir, tmp_path / "ck", "kv_cache fp8", algo="int8_sq", kv_cache="fp8")


class _Toolchain:
    def __init__(self, modelopt: str | None, transformers: str | None) -> None:
        self.name, self.modelopt_version, self.transformers_version = "test-toolchain", modelopt, transformers


def test_versions_must_equal_the_toolchain_pins() -> None:
    import modelopt
    import transformers

    warnings: list[str] = []
    assert check_versions(_Toolchain("0.37", transformers.__version__), warn=warnings.append) == (
        modelopt.__version__,
        transformers.__version__,
    )
    assert check_versions(_Toolchain("~=0.37.0", None), warn=warnings.append)
    assert warnings == [f"toolchain test-toolchain does not pin transformers; using the installed {transformers.__version__}"]
    with pytest.raises(TrtpipeError, match="nvidia-modelopt 0.37.0 is installed but toolchain test-toolchain pins 0.47.0"):
        check_versions(_Toolchain("0.47.0", transformers.__version__), warn=warnings.append)
    with pytest.raises(TrtpipeError, match="pins 4.56.0"):
        check_versions(_Toolchain("0.37.0", "4.56.0"), warn=warnings.append)


def test_missing_calibration_dataset(tiny_llama_dir: Path, tmp_path: Path) -> None:
    _refused(tiny_llama_dir, tmp_path / "ck", "nope.txt", algo="fp8", dataset=tmp_path / "nope.txt")
