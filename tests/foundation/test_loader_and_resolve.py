"""load_spec positions and path anchoring; resolve's results and the rules that must NOT refuse."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtpipe.errors import SpecError
from trtpipe.resolve import resolve
from trtpipe.spec_loader import load_spec


def test_positions_are_one_based_line_and_column(tmp_path: Path, models_dir: Path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(
        f"# comment\nmodel:\n  config: {models_dir / 'llama-3-8b' / 'config.json'}\nengine:\n  max_batch_size: 4\n"
    )
    loaded = load_spec(spec)
    assert loaded.position(("model",)) == (2, 1)
    # written in the earlier shape: the position is kept under today's path, the field shown as written
    assert loaded.position(("limits", "max_batch_size")) == (5, 3)
    assert loaded.shown(("limits", "max_batch_size")) == "engine.max_batch_size"
    assert loaded.position(("runtime",)) is None
    error = loaded.error(("runtime", "streaming"), "bad", "fix it")
    assert isinstance(error, SpecError) and error.one_line() == f"{spec}:1:1: runtime.streaming: bad; fix it"
    # not written: cited at its section, written as engine:, under the name the user's shape gives it
    error = loaded.error(("limits", "max_seq_len"), "too short", "raise limits.max_seq_len")
    assert error.one_line() == f"{spec}:4:1: engine.max_seq_len: too short; raise engine.max_seq_len"


def test_relative_paths_resolve_against_the_spec_folder(tmp_path: Path, hf_dir: Path) -> None:
    sub = tmp_path / "specs"
    sub.mkdir()
    spec = sub / "s.yaml"
    spec.write_text(f"model:\n  path: ../{hf_dir.name}\nquantization:\n  calibration:\n    dataset: data/cal.txt\n")
    loaded = load_spec(spec)
    assert loaded.spec.model.path == hf_dir.resolve()
    assert loaded.spec.quantization.calibration.dataset == (sub / "data" / "cal.txt").resolve()


def test_resolve_local_model(tmp_path: Path, hf_dir: Path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(f"model:\n  path: {hf_dir}\ntarget:\n  gpu: l40s\nquantization:\n  algo: fp8\n  kv_cache: fp8\n")
    resolved = resolve(load_spec(spec))
    assert resolved.gpu is not None and resolved.gpu.sm == 89
    assert resolved.model_dir == hf_dir and resolved.model_config["num_key_value_heads"] == 8
    assert resolved.tokenizer_dir == hf_dir
    assert resolved.weight_dtype == "bfloat16" and resolved.kv_cache_dtype == "fp8"
    assert resolved.toolchain.name == "trtllm-1.2.1"


@pytest.mark.parametrize(
    "extra",
    [
        "target:\n  gpu: cpu-reference\nquantization:\n  algo: fp8\n  kv_cache: fp8\n",  # validates checkpoints
        "target:\n  gpu: cpu-reference\n  tp: 2\n  pp: 2\n",  # reference runtime merges shards
        "target:\n  gpu: a100-80gb\nquantization:\n  algo: int4_awq\n  group_size: 64\n",
        "target:\n  gpu: h100\n  tp: 8\n",  # 8 KV heads over tp=8
        "target:\n  gpu: h100\n  tp: 16\n  pp: 1\n",  # 32 heads over 16; 8 KV heads replicated
        "target:\n  gpu: b200\nquantization:\n  algo: fp8\n  kv_cache: fp8\n",
        "target:\n  gpu: h100\nengine:\n  max_input_len: 4096\n  max_seq_len: 8192\n  max_num_tokens: 1024\n"
        "triton:\n  enable_chunked_context: true\n",
        "target:\n  gpu: h200\nquantization:\n  algo: fp8\n  kv_cache: fp8\nengine:\n  plugins:\n"
        "    use_fp8_context_fmha: enable\n    gemm_plugin: auto\n",
        "toolchain: trtllm-1.1.0\ntarget:\n  gpu: l4\n",
        "backend: trtllm-build\ntarget:\n  gpu: l40s\n",
        "backend: reference\n",
    ],
)
def test_allowed_combinations_resolve(tmp_path: Path, hf_dir: Path, extra: str) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(f"model:\n  path: {hf_dir}\n{extra}")
    resolve(load_spec(spec))


def test_examples_resolve_for_planning(examples_dir: Path) -> None:
    for example in sorted(examples_dir.glob("*.yaml")):
        if example.name.startswith("tiny-cpu"):
            continue  # tiny-cpu.yaml and tiny-cpu-llmapi.yaml need `trtpipe example-model out/tiny-llama` first
        resolved = resolve(load_spec(example), need_weights=False)
        assert resolved.model_dir is None and resolved.config_path.name == "config.json"


def test_tiny_cpu_example_shape(examples_dir: Path) -> None:
    loaded = load_spec(examples_dir / "tiny-cpu.yaml")
    spec = loaded.spec
    assert spec.target.is_cpu_reference and spec.runtime.streaming
    assert (spec.limits.max_batch_size, spec.limits.max_input_len, spec.limits.max_seq_len) == (4, 256, 512)
    assert spec.model.path == (examples_dir / "../../out/tiny-llama").resolve()


@pytest.mark.timeout(300)
def test_tiny_cpu_spec_on_the_example_model(cli, tmp_path: Path, tiny_llama_dir: Path, examples_dir: Path) -> None:
    """The README's main job, in miniature: the tiny-cpu spec against a freshly written example model."""
    spec = tmp_path / "tiny-cpu.yaml"
    spec.write_text((examples_dir / "tiny-cpu.yaml").read_text().replace("../../out/tiny-llama", str(tiny_llama_dir)))
    resolved = resolve(load_spec(spec))
    assert resolved.gpu is None and resolved.model_dir == tiny_llama_dir and resolved.tokenizer_dir == tiny_llama_dir
    assert cli("spec-check", "--weights", spec).code == 0
    plan = cli("plan", spec, "--json")
    assert plan.code == 0 and plan.json()["fits"] is True
    check = cli("check", "--spec", spec, "--json")
    assert check.code in (0, 1)  # 0 unless a package the cpu-reference path needs is missing
    assert check.json()["target"] == "cpu-reference"
