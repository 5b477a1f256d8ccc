"""Malformed specs: each gives ONE line `file:line:col: field: what; fix` on stderr, exit code 2, no traceback.

Each case is a YAML text; the line marked `#<` is the one the error must cite. Placeholders:
{cfg8b} a real Llama-3-8B config.json, {hf} a local HF folder (config.json + safetensors), {tmp} a scratch folder.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

CASES: dict[str, tuple[str, str]] = {
    # ---- YAML itself
    "broken_yaml_unclosed_bracket": ("model:\n  config: {cfg8b}\nengine: [1, 2\ntarget: #<\n  gpu: h100\n", "invalid YAML"),
    "broken_yaml_tab_indent": ("model:\n\tconfig: {cfg8b} #<\n", "invalid YAML"),
    "broken_yaml_bad_indent": ("model:\n  config: {cfg8b}\n   dtype: float16 #<\n", "invalid YAML"),
    "duplicate_top_level_key": ("model:\n  config: {cfg8b}\nmodel: #<\n  config: {cfg8b}\n", "duplicate key 'model'"),
    "duplicate_nested_key": ("model:\n  config: {cfg8b}\nengine:\n  max_batch_size: 8\n  max_batch_size: 16 #<\n", "duplicate key"),
    "top_level_list": ("- model #<\n- target\n", "not a mapping"),
    "top_level_scalar": ("just some words #<\n", "not a mapping"),
    # ---- unknown keys, with a suggestion
    "unknown_top_level_key": ("model:\n  config: {cfg8b}\nengnie: #<\n  max_batch_size: 8\n", "did you mean 'engine'"),
    "unknown_engine_key": ("model:\n  config: {cfg8b}\nengine:\n  max_batch: 8 #<\n", "did you mean 'max_batch_size'"),
    "unknown_quant_key": ("model:\n  config: {cfg8b}\nquantization:\n  kv_cache_dtype: fp8 #<\n", "did you mean 'kv_cache'"),
    "unknown_model_key": ("model:\n  config: {cfg8b}\n  dtpye: float16 #<\n", "did you mean 'dtype'"),
    "unknown_calibration_key": (
        "model:\n  config: {cfg8b}\nquantization:\n  calibration:\n    sample: 10 #<\n",
        "did you mean 'samples'",
    ),
    # ---- bad types and values
    "batch_size_not_a_number": ("model:\n  config: {cfg8b}\nengine:\n  max_batch_size: eight #<\n", "whole number"),
    "batch_size_float": ("model:\n  config: {cfg8b}\nengine:\n  max_batch_size: 8.5 #<\n", "whole number"),
    "streaming_not_bool": ("model:\n  config: {cfg8b}\ntriton:\n  streaming: maybe #<\n", "true or false"),
    "unknown_quant_algo": ("model:\n  config: {cfg8b}\nquantization:\n  algo: fp9 #<\n", "use one of"),
    "unknown_dtype": ("model:\n  config: {cfg8b}\n  dtype: fp32 #<\n", "use one of"),
    "batch_size_zero": ("model:\n  config: {cfg8b}\nengine:\n  max_batch_size: 0 #<\n", "at least 1"),
    "kv_fraction_above_one": (
        "model:\n  config: {cfg8b}\ntriton:\n  kv_cache_free_gpu_mem_fraction: 1.5 #<\n",
        "at most 1",
    ),
    "group_size_unsupported": ("model:\n  config: {cfg8b}\nquantization:\n  group_size: 100 #<\n", "32, 64 or 128"),
    "revision_not_a_commit": (
        "model:\n  repo_id: meta-llama/Meta-Llama-3-8B\n  revision: main #<\n",
        "not a commit hash",
    ),
    "repo_id_without_revision": ("model:\n  repo_id: meta-llama/Meta-Llama-3-8B #<\n", "needs `revision`"),
    "path_and_repo_id": (
        "model:\n  path: {hf} #<\n  repo_id: meta-llama/Meta-Llama-3-8B\n  revision: " + "a" * 40 + "\n",
        "keep one of them",
    ),
    "model_section_missing": ("target: #<\n  gpu: h100\n", "required field is missing"),
    "model_section_is_text": ("model: ./somewhere #<\n", "expected a mapping"),
    "plugin_value_is_a_list": (
        "model:\n  config: {cfg8b}\nengine:\n  plugins:\n    gemm_plugin: [auto] #<\n",
        "plugin override 'gemm_plugin'",
    ),
    "unknown_key_without_close_match": ("model:\n  config: {cfg8b}\nxyzzy: 1 #<\n", "valid keys here"),
    "plugins_not_a_mapping": ("model:\n  config: {cfg8b}\nengine:\n  plugins: [gemm_plugin] #<\n", "mapping"),
    # ---- rules within the spec
    "input_longer_than_seq": (
        "model:\n  config: {cfg8b}\nengine:\n  max_input_len: 4096 #<\n  max_seq_len: 2048\n",
        "max_input_len 4096 > max_seq_len 2048",
    ),
    "gpu_count_not_tp_times_pp": (
        "model:\n  config: {cfg8b}\ntarget:\n  gpu: h100\n  tp: 2\n  gpu_count: 3 #<\n",
        "tp*pp",
    ),
    # ---- rules that need the catalog, the toolchains or config.json (trtpipe.resolve)
    "unknown_gpu": ("model:\n  config: {cfg8b}\ntarget:\n  gpu: h10 #<\n", "did you mean"),
    "unknown_toolchain": ("model:\n  config: {cfg8b}\ntoolchain: trtllm-0.9.9 #<\n", "pinned toolchains"),
    "toolchain_after_1_2_line": ("model:\n  config: {cfg8b}\ntoolchain: trtllm-1.3.0 #<\n", "trtllm-build"),
    "fp8_on_a100": ("model:\n  config: {cfg8b}\ntarget:\n  gpu: a100-80gb\nquantization:\n  algo: fp8 #<\n", "SM80"),
    "fp8_kv_cache_on_a100": (
        "model:\n  config: {cfg8b}\ntarget:\n  gpu: a100-40gb\nquantization:\n  kv_cache: fp8 #<\n",
        "SM80",
    ),
    "w4a8_on_a10g": ("model:\n  config: {cfg8b}\ntarget:\n  gpu: a10g\nquantization:\n  algo: w4a8_awq #<\n", "SM86"),
    "nvfp4_on_h100": ("model:\n  config: {cfg8b}\ntarget:\n  gpu: h100\nquantization:\n  algo: nvfp4 #<\n", "SM100"),
    "max_num_tokens_below_input": (
        "model:\n  config: {cfg8b}\ntarget:\n  gpu: h100\nengine:\n  max_input_len: 4096\n  max_seq_len: 8192\n"
        "  max_num_tokens: 2048 #<\n",
        "runtime.chunked_prefill",
    ),
    "heads_not_divisible_by_tp": ("model:\n  config: {cfg8b}\ntarget:\n  gpu: h100\n  tp: 3 #<\n", "32 attention heads"),
    "gpt_attention_plugin_disabled": (
        "model:\n  config: {cfg8b}\ntarget:\n  gpu: h100\nengine:\n  plugins:\n    gpt_attention_plugin: disable #<\n",
        "in-flight batching",
    ),
    "remove_input_padding_off": (
        "model:\n  config: {cfg8b}\ntarget:\n  gpu: h100\nengine:\n  plugins:\n    remove_input_padding: false #<\n",
        "in-flight batching",
    ),
    "paged_kv_cache_off": (
        "model:\n  config: {cfg8b}\ntarget:\n  gpu: h100\nengine:\n  plugins:\n    paged_kv_cache: disable #<\n",
        "paged KV cache",
    ),
    "fp8_context_fmha_without_fp8_kv": (
        "model:\n  config: {cfg8b}\ntarget:\n  gpu: h100\nquantization:\n  algo: fp8\nengine:\n  plugins:\n"
        "    use_fp8_context_fmha: enable #<\n",
        "FP8 KV cache",
    ),
    "reference_executor_on_gpu": (
        "model:\n  config: {cfg8b}\ntarget:\n  gpu: h100\n  executor: reference #<\n",
        "cpu-reference",
    ),
    "triton_batch_above_engine": (
        "model:\n  config: {cfg8b}\nengine:\n  max_batch_size: 4\ntriton:\n  max_batch_size: 8 #<\n",
        "exceeds",
    ),
    "seq_len_beyond_model": ("model:\n  config: {cfg8b}\nengine:\n  max_seq_len: 16384 #<\n", "max_position_embeddings"),
    # ---- the model section on disk
    "model_path_missing": ("model:\n  path: {tmp}/no-such-model #<\n", "does not exist"),
    "model_path_without_config": ("model:\n  path: {tmp} #<\n", "no config.json"),
    "model_config_missing": ("model:\n  config: {tmp}/nothing/config.json #<\n", "does not exist"),
    "model_config_not_json": ("model:\n  config: {tmp}/broken.json #<\n", "not valid JSON"),
    "model_config_not_an_llm": ("model:\n  config: {tmp}/vision.json #<\n", "lacks"),
    "tokenizer_folder_missing": ("model:\n  path: {hf}\n  tokenizer: {tmp}/no-tokenizer #<\n", "tokenizer"),
    # ---- issue 13: accepted by spec-check before, refused later (or never); now refused here
    "int8_weight_only": ("model:\n  config: {cfg8b}\ntarget:\n  gpu: h100\nquantization:\n  algo: int8_wo #<\n",
                         "no INT8 weight-only config"),
    "int8_weight_only_on_cpu_reference": ("model:\n  config: {cfg8b}\nquantization:\n  algo: int8_wo #<\n",
                                          "use int8_sq"),
    "int8_kv_cache": ("model:\n  config: {cfg8b}\ntarget:\n  gpu: a100-80gb\nquantization:\n  algo: int4_awq\n"
                      "  kv_cache: int8 #<\n", "no INT8 KV-cache config"),
    "nvfp4_on_b200": ("model:\n  config: {cfg8b}\ntarget:\n  gpu: b200\nquantization:\n  algo: nvfp4 #<\n",
                      "no NVFP4 recipe"),
    "fp8_kv_cache_on_smoothquant": ("model:\n  config: {cfg8b}\ntarget:\n  gpu: h100\nquantization:\n  algo: int8_sq\n"
                                    "  kv_cache: fp8 #<\n", "offered on top of fp8, int4_awq, w4a8_awq"),
    "tokens_per_block_not_power_of_two": ("model:\n  config: {cfg8b}\nengine:\n  tokens_per_block: 48 #<\n",
                                          "not a power of two"),
    "unknown_plugin_name": ("model:\n  config: {cfg8b}\ntarget:\n  gpu: h100\nengine:\n  plugins:\n"
                            "    fancy_attention_plugin: enable #<\n", "not a trtllm-build plugin option"),
    "unknown_plugin_name_on_cpu_reference": ("model:\n  config: {cfg8b}\nengine:\n  plugins:\n    gemm_plugn: auto #<\n",
                                             "not a trtllm-build plugin option"),
    "seed_beyond_64_bits": ("model:\n  config: {cfg8b}\nquantization:\n  calibration:\n"
                            "    seed: 18446744073709551616 #<\n", "at most 18446744073709551615"),
    "calibration_dataset_missing": ("model:\n  config: {cfg8b}\nquantization:\n  algo: int4_awq\n  calibration:\n"
                                    "    dataset: {tmp}/no-such-text.txt #<\n", "does not exist"),
    "gate_channel_with_a_slash": ("model:\n  config: {cfg8b}\nrelease:\n  gates:\n    prod/eu: #<\n"
                                  "      smoke: true\n", "channel 'prod/eu' is not a plain name"),
    "gate_channel_with_a_newline": ("model:\n  config: {cfg8b}\nrelease:\n  gates:\n    \"prod\\n\": #<\n"
                                    "      smoke: true\n", "not a plain name"),
    "name_with_a_newline": ("name: \"tiny\\nllama\" #<\nmodel:\n  config: {cfg8b}\n", "not a plain name"),
    "tp_times_pp_beyond_the_gpu_cap": ("model:\n  config: {cfg8b}\ntarget:\n  gpu: h100\n  tp: 64 #<\n  pp: 16\n",
                                       "exceeds the 512"),
    "queue_delay_beyond_uint64": ("model:\n  config: {cfg8b}\ntriton:\n"
                                  "  max_queue_delay_microseconds: 18446744073709551616 #<\n", "at most"),
    "toolchain_the_converter_is_not_written_for": ("model:\n  config: {cfg8b}\ntoolchain: trtllm-1.0.0 #<\n",
                                                   "converts with nvidia-modelopt 0.33"),
    "layers_not_divisible_by_pp": ("model:\n  config: {cfg8b}\ntarget:\n  gpu: h100\n  pp: 3 #<\n",
                                   "32 layers do not split evenly"),
    "architecture_the_converter_lacks": ("model:\n  config: {tmp}/gptneox/config.json #<\n", "not supported"),
    "reference_backend_on_a_gpu": ("model:\n  config: {cfg8b}\ntarget:\n  gpu: h100\nbackend: reference #<\n",
                                   "runs on the CPU"),
    "unknown_backend": ("model:\n  config: {cfg8b}\nbackend: vllm #<\n", "not a backend"),
}


def _materialise(tmp_path: Path, text: str, cfg8b: Path, hf: Path) -> tuple[Path, int]:
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "vision.json").write_text('{"model_type": "clip_vision"}')
    (tmp_path / "gptneox").mkdir()
    neox = {"architectures": ["GPTNeoXForCausalLM"], "num_hidden_layers": 4, "num_attention_heads": 8,
            "hidden_size": 512, "vocab_size": 1000, "intermediate_size": 2048}
    (tmp_path / "gptneox" / "config.json").write_text(json.dumps(neox))
    text = text.replace("{cfg8b}", str(cfg8b)).replace("{hf}", str(hf)).replace("{tmp}", str(tmp_path))
    lines = text.splitlines()
    marked = [i + 1 for i, line in enumerate(lines) if line.rstrip().endswith("#<")]
    assert len(marked) == 1, "each case marks exactly one line"
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    return spec, marked[0]


def assert_one_line_error(result, spec: Path, line: int, needle: str) -> None:
    assert result.code == 2, (result.code, result.err)
    assert "Traceback" not in result.err + result.out
    lines = [x for x in result.err.splitlines() if x.strip()]
    assert len(lines) == 1, result.err
    assert f"{spec}:{line}:" in lines[0], lines[0]
    assert needle in lines[0], lines[0]


def test_there_are_at_least_30_cases() -> None:
    assert len(CASES) + 3 >= 30  # + empty file, missing file, non-UTF-8 below


@pytest.mark.parametrize("name", sorted(CASES))
def test_malformed_spec_gives_one_positioned_line(name: str, cli, tmp_path: Path, models_dir: Path, hf_dir: Path) -> None:
    text, needle = CASES[name]
    spec, line = _materialise(tmp_path, text, models_dir / "llama-3-8b" / "config.json", hf_dir)
    result = cli("spec-check", spec)
    assert_one_line_error(result, spec, line, needle)


def test_empty_file(cli, tmp_path: Path) -> None:
    spec = tmp_path / "empty.yaml"
    spec.write_text("\n# nothing here\n")
    assert_one_line_error(cli("spec-check", spec), spec, 1, "empty")


def test_missing_file(cli, tmp_path: Path) -> None:
    spec = tmp_path / "absent.yaml"
    assert_one_line_error(cli("spec-check", spec), spec, 1, "does not exist")


def test_not_utf8(cli, tmp_path: Path) -> None:
    spec = tmp_path / "latin1.yaml"
    spec.write_bytes(b"model:\n  config: caf\xe9\n")
    assert_one_line_error(cli("spec-check", spec), spec, 2, "UTF-8")


def test_plan_only_spec_refused_when_weights_needed(cli, tmp_path: Path, models_dir: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"model:\n  config: {models_dir / 'llama-3-8b' / 'config.json'}\n")
    assert cli("spec-check", spec).code == 0
    assert_one_line_error(cli("spec-check", "--weights", spec), spec, 2, "planning only")


def test_pickle_only_weights_refused(cli, tmp_path: Path, hf_dir: Path) -> None:
    (hf_dir / "model.safetensors").unlink()
    (hf_dir / "pytorch_model.bin").write_bytes(b"")
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"model:\n  path: {hf_dir}\n")
    assert_one_line_error(cli("spec-check", "--weights", spec), spec, 2, "allow_pickle")


def test_first_problem_in_file_order_is_reported(cli, tmp_path: Path, models_dir: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        f"model:\n  config: {models_dir / 'llama-3-8b' / 'config.json'}\n  dtpye: x\nengine:\n  max_batch_size: no\n"
    )
    result = cli("spec-check", spec)
    assert_one_line_error(result, spec, 3, "dtpye")
    assert "1 more problem" in result.err


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["fp8_on_a100", "duplicate_nested_key"])
def test_malformed_spec_through_a_subprocess(name: str, tmp_path: Path, models_dir: Path, hf_dir: Path) -> None:
    text, needle = CASES[name]
    spec, line = _materialise(tmp_path, text, models_dir / "llama-3-8b" / "config.json", hf_dir)
    proc = subprocess.run(
        [sys.executable, "-m", "trtpipe.cli", "plan", str(spec)], capture_output=True, text=True, timeout=110
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and f"{spec}:{line}:" in lines[0] and needle in lines[0], proc.stderr


@pytest.mark.timeout(300)
def test_awq_group_size_against_every_gemm_width_per_tp_shard(cli, tmp_path: Path, tiny_llama_dir: Path) -> None:
    """Issue 13's case: the tiny Llama (4 heads x 64) with int4_awq, tp=4, group 128 passed spec-check, then the
    converter refused it (attention.dense has 4*64/4 = 64 inputs per shard). spec-check refuses it now."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"model:\n  path: {tiny_llama_dir}\ntarget:\n  tp: 4\nquantization:\n  algo: int4_awq\n"
                    "  group_size: 128\n")
    result = cli("spec-check", "--weights", spec)
    assert_one_line_error(result, spec, 7, "does not divide the input width 64 of attention.dense")
    assert "use group_size 32 or 64" in result.err
    spec.write_text(spec.read_text().replace("group_size: 128", "group_size: 64"))
    assert cli("spec-check", "--weights", spec).code == 0


def test_a_build_needs_the_tokenizer_the_repository_serves(cli, tmp_path: Path, hf_dir: Path) -> None:
    (hf_dir / "tokenizer.json").unlink()
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"model:\n  path: {hf_dir}\n")
    assert cli("spec-check", spec).code == 0  # planning does not need it
    assert_one_line_error(cli("spec-check", "--weights", spec), spec, 2, "has no tokenizer (tokenizer.json)")


def test_a_gpu_target_needs_a_pinned_container(cli, tmp_path: Path, models_dir: Path, monkeypatch) -> None:
    """Its repository names the container that serves it (publish refused one without), docker builds in it."""
    import shutil

    from trtpipe.shipped import shipped_build_configs_dir

    configs = tmp_path / "build_configs"
    shutil.copytree(shipped_build_configs_dir(), configs)
    table = configs / "toolchains.yaml"
    table.write_text(table.read_text().replace(
        'triton_container: "nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3"', "triton_container: null"))
    monkeypatch.setenv("TRTPIPE_BUILD_CONFIGS", str(configs))
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"model:\n  config: {models_dir / 'llama-3-8b' / 'config.json'}\ntarget:\n  gpu: h100\n"
                    "  executor: local\n")
    assert_one_line_error(cli("spec-check", spec), spec, 4, "pins no triton_container")
    spec.write_text(spec.read_text() + "toolchain: trtllm-1.2.1\n")
    assert_one_line_error(cli("spec-check", spec), spec, 6, "pins no triton_container")
    spec.write_text(f"model:\n  config: {models_dir / 'llama-3-8b' / 'config.json'}\n")
    assert cli("spec-check", spec).code == 0  # cpu-reference serves in this host's tritonserver
