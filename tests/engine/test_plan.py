"""The build plan: profiles per GPU family, limits, overrides, in-flight batching enforcement."""

from __future__ import annotations

import pytest

from trtpipe.engine.plan import make_build_plan
from trtpipe.errors import SpecError
from trtpipe.gpu import load_catalog

from .conftest import GPU_EXAMPLES, resolve_example, resolve_text

# The exact commands, pinned: any change to what these engines are built with shows up here.
# No --opt_num_tokens: with --multiple_profiles enable trtllm-build's main() raises RuntimeError when it is
# set (rule opt-num-tokens-with-multiple-profiles); these pins held it until issue 12.
H100_FP8_COMMAND = (
    "trtllm-build --checkpoint_dir /ckpt --output_dir /engine "
    "--max_batch_size 64 --max_input_len 4096 --max_seq_len 8192 --max_num_tokens 8192 "
    "--max_beam_width 1 --kv_cache_type paged "
    "--gpt_attention_plugin auto --remove_input_padding enable --context_fmha enable "
    "--use_paged_context_fmha enable --tokens_per_block 32 --use_fused_mlp enable --multiple_profiles enable "
    "--gemm_plugin disable --use_fp8_context_fmha enable --gemm_swiglu_plugin fp8 --low_latency_gemm_plugin disable "
    "--low_latency_gemm_swiglu_plugin disable --reduce_fusion disable --user_buffer disable "
    "--workers 1 --log_level info"
)
# INT4-AWQ: --use_fused_mlp disable, as trtllm-build ends up (rule fused-mlp-needs-fp8-or-no-quant).
A100_INT4_AWQ_COMMAND = (
    "trtllm-build --checkpoint_dir /ckpt --output_dir /engine "
    "--max_batch_size 32 --max_input_len 4096 --max_seq_len 8192 --max_num_tokens 8192 "
    "--max_beam_width 1 --kv_cache_type paged "
    "--gpt_attention_plugin auto --remove_input_padding enable --context_fmha enable "
    "--use_paged_context_fmha enable --tokens_per_block 32 --use_fused_mlp disable --multiple_profiles enable "
    "--gemm_plugin auto --use_fp8_context_fmha disable --gemm_swiglu_plugin disable --low_latency_gemm_plugin disable "
    "--low_latency_gemm_swiglu_plugin disable --reduce_fusion disable --user_buffer disable "
    "--workers 1 --log_level info"
)


def test_h100_fp8_command_is_pinned():
    plan = make_build_plan(resolve_example("llama3-8b-fp8-h100"))
    assert " ".join(plan.render_command("/ckpt", "/engine")) == H100_FP8_COMMAND
    assert plan.family == "hopper" and plan.gpu_sm == 90 and plan.trtllm_version == "1.2.1"


def test_a100_int4_awq_command_is_pinned():
    plan = make_build_plan(resolve_example("llama3-8b-int4awq-a100"))
    assert " ".join(plan.render_command("/ckpt", "/engine")) == A100_INT4_AWQ_COMMAND
    assert plan.family == "ampere" and plan.gpu_sm == 80


@pytest.mark.parametrize("example", GPU_EXAMPLES)
def test_every_setting_says_why_and_build_config_nests_plugins(example):
    plan = make_build_plan(resolve_example(example))
    for key in list(plan.limits) + list(plan.plugin_config):
        assert plan.why.get(key), key
    assert plan.build_config["plugin_config"] == plan.plugin_config
    assert plan.build_config["kv_cache_type"] == "paged"
    assert plan.model_dump(mode="json")["build_config"]["max_seq_len"] == plan.limits["max_seq_len"]


@pytest.mark.parametrize("gpu", sorted(load_catalog()))
def test_the_family_is_the_catalogs_architecture(tmp_path, llama8b_config, gpu):
    """The GPU catalog's `architecture` picks the build profile (it replaced a table of SM ranges here)."""
    catalog = load_catalog()
    plan = make_build_plan(resolve_text(tmp_path, f"model:\n  config: {llama8b_config}\ntarget:\n  gpu: {gpu}\n"))
    assert plan.family == catalog[gpu].architecture
    expected = {80: "ampere", 86: "ampere", 89: "ada", 90: "hopper", 100: "blackwell"}[catalog[gpu].sm]
    assert plan.family == expected


def test_the_reference_family(tmp_path, llama8b_config):
    plan = make_build_plan(resolve_text(tmp_path, f"model:\n  config: {llama8b_config}\n"))
    assert plan.family == "reference" and plan.gpu_sm is None


def test_latency_profile_on_hopper_fp8_uses_low_latency_gemms():
    resolved = resolve_example("llama3-8b-fp8-h100")
    resolved.spec.limits.profile = "latency"
    plan = make_build_plan(resolved)
    assert plan.plugin_config["low_latency_gemm_plugin"] == "fp8"
    assert plan.plugin_config["low_latency_gemm_swiglu_plugin"] == "fp8"
    assert plan.plugin_config["gemm_swiglu_plugin"] is None  # the low-latency variant replaces it
    assert plan.limits["max_num_tokens"] == 8192  # the spec sets it explicitly
    assert plan.plugin_config["reduce_fusion"] is False  # tp == 1


@pytest.mark.parametrize("profile", ["throughput", "latency"])
def test_tensor_parallel_llama_fuses_allreduce_and_user_buffers(profile):
    resolved = resolve_example("llama3-70b-fp8-4xh100")
    resolved.spec.limits.profile = profile
    plan = make_build_plan(resolved)
    assert plan.plugin_config["reduce_fusion"] is True
    assert plan.plugin_config["user_buffer"] is True
    assert plan.workers == 4 and plan.world_size == 4


def test_latency_profile_on_ampere_has_no_fp8_kernels():
    resolved = resolve_example("llama2-13b-fp16-a100")
    resolved.spec.limits.profile = "latency"
    plan = make_build_plan(resolved)
    assert plan.plugin_config["low_latency_gemm_plugin"] is None
    assert plan.plugin_config["use_fp8_context_fmha"] is False
    assert plan.plugin_config["gemm_plugin"] == "auto"


def test_profile_default_max_num_tokens(tmp_path, llama8b_config):
    base = f"model:\n  config: {llama8b_config}\ntarget:\n  gpu: a100-80gb\nengine:\n  max_batch_size: 64\n  max_input_len: 1024\n  max_seq_len: 4096\n"
    throughput = make_build_plan(resolve_text(tmp_path, base + "  profile: throughput\n"))
    latency = make_build_plan(resolve_text(tmp_path, base + "  profile: latency\n"))
    assert throughput.limits["max_num_tokens"] == 8192
    assert latency.limits["max_num_tokens"] == 2048
    assert latency.limits["opt_num_tokens"] is None  # multiple profiles: trtllm-build refuses an explicit one
    assert "opt-num-tokens-with-multiple-profiles" in latency.why["opt_num_tokens"]


def test_max_num_tokens_covers_a_whole_prompt_without_chunked_context(tmp_path, llama8b_config):
    text = (f"model:\n  config: {llama8b_config}\ntarget:\n  gpu: a100-80gb\nengine:\n  max_batch_size: 8\n"
            "  max_input_len: 4000\n  max_seq_len: 8192\n  profile: latency\n")
    plan = make_build_plan(resolve_text(tmp_path, text))
    assert plan.limits["max_num_tokens"] == 4000


def test_override_applies_on_top_of_profile(tmp_path, llama8b_config):
    text = (f"model:\n  config: {llama8b_config}\ntarget:\n  gpu: a100-80gb\n"
            "engine:\n  plugins:\n    gemm_plugin: float16\n    multiple_profiles: false\n")
    plan = make_build_plan(resolve_text(tmp_path, text))
    assert plan.plugin_config["gemm_plugin"] == "float16"
    assert plan.plugin_config["multiple_profiles"] is False
    assert plan.overrides == ["gemm_plugin", "multiple_profiles"]
    argv = plan.render_command("/c", "/e")
    assert argv[argv.index("--multiple_profiles") + 1] == "disable"
    # a single profile: opt_num_tokens is TRT-LLM's default min(max_batch_size*max_beam_width, max_num_tokens)
    assert argv[argv.index("--opt_num_tokens") + 1] == str(plan.limits["opt_num_tokens"]) == "8"


def _positioned(err: SpecError, text: str, key: str) -> None:
    line_no = next(i for i, line in enumerate(text.splitlines(), 1) if line.strip().startswith(f"{key}:"))
    assert err.line == line_no, (err.one_line(), line_no)
    assert "\n" not in err.one_line()


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("gpt_attention_plugin", "disable", "GPT attention plugin"),
        ("remove_input_padding", "false", "packed input"),
        ("paged_kv_cache", "false", "paged KV cache"),
    ],
)
def test_override_that_breaks_inflight_batching_is_a_positioned_error(tmp_path, llama8b_config, key, value, message):
    # resolve() may refuse these itself; the plan must refuse them too, so set them after resolving.
    text = (f"model:\n  config: {llama8b_config}\ntarget:\n  gpu: a100-80gb\n"
            f"engine:\n  plugins:\n    {key}: {value}\n")
    try:
        resolved = resolve_text(tmp_path, text)
    except SpecError as err:
        assert message.split()[0].lower() in err.one_line().lower()
        resolved = resolve_text(tmp_path, text.replace(f"    {key}: {value}\n", "    context_fmha: true\n"))
        resolved.spec.backend.plugins = {key: {"false": False}.get(value, value)}
        with pytest.raises(SpecError) as info:
            make_build_plan(resolved)
        assert message in info.value.one_line()
        return
    with pytest.raises(SpecError) as info:
        make_build_plan(resolved)
    assert message in info.value.one_line()
    _positioned(info.value, text, key)


def test_removed_flag_as_override_is_refused_with_hint(tmp_path, llama8b_config):
    text = (f"model:\n  config: {llama8b_config}\ntarget:\n  gpu: a100-80gb\n"
            "engine:\n  plugins:\n    multi_block_mode: true\n")
    with pytest.raises(SpecError) as info:
        make_build_plan(resolve_text(tmp_path, text))
    assert "runtime option" in info.value.one_line()
    assert "engine.plugins.multi_block_mode" in info.value.one_line()
    _positioned(info.value, text, "multi_block_mode")


@pytest.mark.parametrize(
    "gpu, algo, plugins, message",
    [
        ("a100-80gb", "none", "low_latency_gemm_plugin: fp8", "Hopper only"),
        ("a100-80gb", "none", "use_fp8_context_fmha: true", "rule fp8-context-fmha-needs-fp8-quant"),
        ("a100-80gb", "none", "gemm_plugin: nvfp4", "Blackwell"),
        ("a100-80gb", "none", "gemm_plugin: fp16", "choose one of"),
        ("a100-80gb", "none", "user_buffer: true", "rule user-buffer-needs-reduce-fusion"),
        ("a100-80gb", "none", "reduce_fusion: true", "rule reduce-fusion-needs-tp-and-architecture"),
    ],
)
def test_invalid_overrides(tmp_path, llama8b_config, gpu, algo, plugins, message):
    text = (f"model:\n  config: {llama8b_config}\ntarget:\n  gpu: {gpu}\nquantization:\n  algo: {algo}\n"
            f"engine:\n  plugins:\n    {plugins}\n")
    with pytest.raises(SpecError, match=message):
        make_build_plan(resolve_text(tmp_path, text))


def test_paged_context_fmha_needed_by_chunked_context(tmp_path, llama8b_config):
    text = (f"model:\n  config: {llama8b_config}\ntarget:\n  gpu: a100-80gb\n"
            "engine:\n  plugins:\n    use_paged_context_fmha: false\ntriton:\n  enable_chunked_context: true\n")
    with pytest.raises(SpecError, match="enable_chunked_context"):
        make_build_plan(resolve_text(tmp_path, text))


def test_tokens_per_block_must_be_power_of_two(tmp_path, llama8b_config):
    text = f"model:\n  config: {llama8b_config}\ntarget:\n  gpu: a100-80gb\nengine:\n  tokens_per_block: 48\n"
    with pytest.raises(SpecError, match="power of two") as info:
        make_build_plan(resolve_text(tmp_path, text))
    _positioned(info.value, text, "tokens_per_block")


def test_max_num_tokens_below_prompt_is_refused(tmp_path, llama8b_config):
    text = (f"model:\n  config: {llama8b_config}\ntarget:\n  gpu: a100-80gb\n"
            "engine:\n  max_input_len: 2048\n  max_seq_len: 4096\n  max_num_tokens: 1024\n")
    with pytest.raises(SpecError, match="max_num_tokens 1024 < max_input_len 2048"):
        make_build_plan(resolve_text(tmp_path, text))
