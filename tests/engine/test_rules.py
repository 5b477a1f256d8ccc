"""trtllm-build's own rules (build_configs/trtllm_build_flags/rules.yaml): each can refuse or override,
every rendered command passes them, and the plan, resolve and the CLI use them."""

from __future__ import annotations

import pytest

from trtpipe import quant
from trtpipe.cli import main
from trtpipe.engine.plan import make_build_plan
from trtpipe.trtllm_build.rules import CHECKS, BuildFacts, load_rules, simulate_command
from trtpipe.errors import SpecError, TrtpipeError
from trtpipe.toolchain import load_toolchains

from .conftest import GPU_EXAMPLES, resolve_example, resolve_text, with_toolchain

TOOLCHAINS = sorted(load_toolchains())
LLAMA = BuildFacts(architecture="LlamaForCausalLM", sm=90)

# rule id -> (toolchain, extra argv, facts, what trtllm-build ends with (overrides) or None (refusals))
BREAKING: dict[str, tuple[str, list[str], BuildFacts, dict | None]] = {
    "gather-context-logits-with-draft-len": ("trtllm-1.2.1", ["--gather_context_logits", "--max_draft_len", "4"],
                                             LLAMA, None),
    "plugin-unsupported-on-sm100": ("trtllm-1.2.1", ["--low_latency_gemm_plugin", "fp8"],
                                    BuildFacts(architecture="LlamaForCausalLM", quant_algo="FP8", sm=100), None),
    "fused-mlp-needs-fp8-or-no-quant": ("trtllm-1.2.1", ["--use_fused_mlp", "enable"],
                                        BuildFacts(architecture="LlamaForCausalLM", quant_algo="W4A16_AWQ", sm=80),
                                        {"use_fused_mlp": False}),
    "opt-num-tokens-with-multiple-profiles": ("trtllm-1.2.1", ["--multiple_profiles", "enable", "--opt_num_tokens", "64"],
                                              LLAMA, None),
    "kv-cache-type-conflicts-paged-kv-cache": ("trtllm-1.2.1", ["--kv_cache_type", "paged", "--paged_kv_cache", "disable"],
                                               LLAMA, None),
    "streamingllm-llama-only": ("trtllm-1.1.0", ["--streamingllm", "enable"],
                                BuildFacts(architecture="Qwen2ForCausalLM", sm=90), None),
    "streamingllm-removed": ("trtllm-1.2.1", ["--streamingllm", "enable"], LLAMA, None),
    "pp-reduce-scatter-mixtral-only": ("trtllm-1.2.1", ["--pp_reduce_scatter", "enable"], LLAMA, None),
    "max-input-len-clipped-to-max-seq-len": ("trtllm-1.2.1", ["--max_input_len", "4096", "--max_seq_len", "2048"],
                                             LLAMA, {"max_input_len": 2048}),
    "max-num-tokens-ignored-without-packed-input": (
        "trtllm-1.2.1", ["--remove_input_padding", "disable", "--max_num_tokens", "4096", "--max_seq_len", "2048",
                         "--max_batch_size", "8"], LLAMA, {"max_num_tokens": 16384}),
    "max-num-tokens-capped": ("trtllm-1.2.1", ["--max_batch_size", "2", "--max_seq_len", "1024",
                                               "--max_num_tokens", "8192"], LLAMA, {"max_num_tokens": 2048}),
    "max-num-tokens-raised-to-max-input-len": (
        "trtllm-1.2.1", ["--context_fmha", "disable", "--max_input_len", "2048", "--max_seq_len", "4096",
                         "--max_num_tokens", "1024"], LLAMA, {"max_num_tokens": 2048}),
    "max-num-tokens-raised-to-tokens-per-block": (
        "trtllm-1.2.1", ["--max_num_tokens", "16", "--tokens_per_block", "64", "--max_seq_len", "4096"], LLAMA,
        {"max_num_tokens": 64}),
    "opt-num-tokens-capped": ("trtllm-1.2.1", ["--max_num_tokens", "256", "--opt_num_tokens", "512",
                                               "--max_seq_len", "4096"], LLAMA, {"opt_num_tokens": 256}),
    "streamingllm-disables-paged-context-fmha": ("trtllm-1.1.0", ["--streamingllm", "enable",
                                                                  "--use_paged_context_fmha", "enable"],
                                                 LLAMA, {"use_paged_context_fmha": False}),
    "reduce-fusion-needs-tp-and-architecture": ("trtllm-1.2.1", ["--reduce_fusion", "enable"], LLAMA,
                                                {"reduce_fusion": False}),
    "user-buffer-needs-reduce-fusion": ("trtllm-1.2.1", ["--user_buffer", "enable", "--reduce_fusion", "disable"],
                                        LLAMA, {"user_buffer": False}),
    "norm-quant-fusion-conditions": ("trtllm-1.2.1", ["--norm_quant_fusion", "enable"],
                                     BuildFacts(architecture="LlamaForCausalLM", quant_algo="FP8", sm=90),
                                     {"norm_quant_fusion": False}),
    "speculative-decoding-extends-max-seq-len": (
        "trtllm-1.2.1", ["--speculative_decoding_mode", "medusa", "--max_draft_len", "4", "--max_seq_len", "2048"],
        LLAMA, {"max_seq_len": 2052}),
    "speculative-decoding-raises-max-num-tokens": (
        "trtllm-1.2.1", ["--speculative_decoding_mode", "medusa", "--max_draft_len", "4", "--max_batch_size", "64",
                         "--max_num_tokens", "128", "--max_seq_len", "4096"], LLAMA, {"max_num_tokens": 320}),
    "context-fmha-off-disables-fp8-and-paged": ("trtllm-1.2.1", ["--context_fmha", "disable",
                                                                 "--use_paged_context_fmha", "enable"],
                                                LLAMA, {"use_paged_context_fmha": False}),
    "fp8-context-fmha-needs-fp8-quant": ("trtllm-1.2.1", ["--use_fp8_context_fmha", "enable"],
                                         BuildFacts(architecture="LlamaForCausalLM", quant_algo="W4A16_AWQ", sm=90),
                                         {"use_fp8_context_fmha": False}),
    "fp8-context-fmha-needs-sm89": ("trtllm-1.2.1", ["--use_fp8_context_fmha", "enable"],
                                    BuildFacts(architecture="LlamaForCausalLM", quant_algo="FP8", sm=80),
                                    {"use_fp8_context_fmha": False}),
    "fp8-context-fmha-follows-fp8-kv-cache": (
        "trtllm-1.2.1", ["--use_fp8_context_fmha", "disable", "--use_paged_context_fmha", "enable"],
        BuildFacts(architecture="LlamaForCausalLM", quant_algo="FP8", kv_cache_quant_algo="FP8", sm=90),
        {"use_fp8_context_fmha": True}),
    "paged-context-fmha-off-with-int8-kv": ("trtllm-1.2.1", ["--use_paged_context_fmha", "enable"],
                                            BuildFacts(architecture="LlamaForCausalLM", kv_cache_quant_algo="INT8",
                                                       sm=90), {"use_paged_context_fmha": False}),
    "int-quant-refused-on-sm100": ("trtllm-1.2.1", [], BuildFacts(architecture="LlamaForCausalLM",
                                                                  quant_algo="W4A16_AWQ", sm=100), None),
    "smoothquant-refused-on-sm100": ("trtllm-1.2.1", [], BuildFacts(architecture="LlamaForCausalLM",
                                                                    quant_algo="W8A8_SQ_PER_CHANNEL", sm=100), None),
    "gemm-swiglu-needs-fused-mlp": ("trtllm-1.2.1", ["--gemm_swiglu_plugin", "fp8", "--use_fused_mlp", "disable"],
                                    BuildFacts(architecture="LlamaForCausalLM", quant_algo="FP8", sm=90), None),
    "nvfp4-enables-gemm-plugin": ("trtllm-1.2.1", ["--gemm_plugin", "auto"],
                                  BuildFacts(architecture="LlamaForCausalLM", quant_algo="NVFP4", sm=100),
                                  {"gemm_plugin": "nvfp4"}),
    "eagle-needs-paged-context-fmha": ("trtllm-1.2.1", ["--speculative_decoding_mode", "eagle", "--max_draft_len", "4",
                                                        "--use_paged_context_fmha", "disable"],
                                       LLAMA, {"use_paged_context_fmha": True}),
    "inflight-batching-needs-paged-kv-packed-input-gpt-attention": ("trtllm-1.2.1", ["--kv_cache_type", "continuous"],
                                                                    LLAMA, None),
}


def test_every_rule_has_one_check_and_a_breaking_case():
    table = load_rules()
    ids = [rule.id for rule in table.rules]
    assert len(ids) == len(set(ids))
    assert set(ids) == set(CHECKS) == set(BREAKING)


def test_every_citation_names_a_source_and_every_line_is_a_counted_build_py_line():
    table = load_rules()
    for rule in table.rules:
        assert rule.toolchains <= set(TOOLCHAINS), rule.id
        for cite in rule.cite:
            source = table.sources[cite.source]
            assert source.file.startswith(("tensorrt_llm/", "cpp/tensorrt_llm/")), rule.id
            # a line number only where the whole file was read and counted (both build.py copies)
            if cite.line is not None:
                assert cite.source in ("build-pre8329", "build-post8329") and source.commit, rule.id
            assert source.verified is False  # no copy at a release tag could be read; the table says so


@pytest.mark.parametrize("rule_id", sorted(BREAKING))
def test_each_rule_fires_on_a_command_that_breaks_it(rule_id):
    toolchain, extra, facts, ends_with = BREAKING[rule_id]
    table = load_rules()
    rule = table.for_toolchain(toolchain)[rule_id]
    sim = simulate_command(toolchain, ["trtllm-build", "--checkpoint_dir", "/c", *extra], facts)
    finding = next((f for f in sim.findings if f.rule == rule_id), None)
    assert finding is not None, [f.rule for f in sim.findings]
    assert finding.effect == rule.effect
    # the reason names the rule and where it is written for this era
    assert f"rule {rule_id}" in finding.message and table.sources[rule.cite[0].source].file in finding.message
    assert "\n" not in finding.message
    if ends_with is None:
        assert rule.effect == "refuse" and "refuses this" in finding.message
    else:
        assert rule.effect == "override" and "overrides" in finding.message
        assert finding.changes == ends_with
        for key, value in ends_with.items():
            assert sim.settings[key] == value


@pytest.mark.parametrize("toolchain", TOOLCHAINS)
def test_a_plain_command_breaks_no_rule(toolchain):
    sim = simulate_command(toolchain, ["trtllm-build", "--checkpoint_dir", "/c", "--max_seq_len", "4096"], LLAMA)
    assert sim.findings == []


def test_rules_apply_only_to_their_eras():
    argv = ["trtllm-build", "--streamingllm", "enable", "--use_paged_context_fmha", "disable"]
    llama_11 = simulate_command("trtllm-1.1.0", argv, LLAMA)
    assert llama_11.findings == []  # 1.1.0 builds StreamingLLM for Llama (build.py@008b2b8:349)
    llama_12 = simulate_command("trtllm-1.2.1", argv, LLAMA)
    assert [f.rule for f in llama_12.refusals] == ["streamingllm-removed"]
    assert "build.py:328" in llama_12.refusals[0].message
    multiple = ["trtllm-build", "--multiple_profiles", "enable", "--opt_num_tokens", "8"]
    for toolchain, line in [("trtllm-0.21.0", 545), ("trtllm-1.0.0", 545), ("trtllm-1.1.0", 545), ("trtllm-1.2.1", 505)]:
        [finding] = simulate_command(toolchain, multiple, LLAMA).refusals
        assert f"tensorrt_llm/commands/build.py:{line} main()" in finding.message


def test_a_build_config_file_lifts_the_opt_num_tokens_rule():
    argv = ["trtllm-build", "--build_config", "b.json", "--multiple_profiles", "enable", "--opt_num_tokens", "8"]
    assert simulate_command("trtllm-1.2.1", argv, LLAMA).findings == []


# ------------------------------------------------------------------------------------- rendered commands


@pytest.mark.parametrize("toolchain", TOOLCHAINS)
@pytest.mark.parametrize("example", GPU_EXAMPLES)
@pytest.mark.parametrize("profile", ["throughput", "latency"])
def test_every_gpu_example_command_passes_the_pinned_rules(toolchain, example, profile):
    resolved = resolve_example(example)
    resolved.spec.limits.profile = profile
    plan = make_build_plan(with_toolchain(resolved, toolchain))
    argv = plan.render_command("/ckpt", "/engine")  # raises on any finding
    sim = simulate_command(toolchain, argv, plan.facts())
    assert sim.findings == []
    pairs = dict(zip(argv[1::2], argv[2::2]))
    assert "--opt_num_tokens" not in pairs and pairs["--multiple_profiles"] == "enable"
    # the plan prints what trtllm-build builds: every planned setting survives the rules unchanged
    for key, value in plan.plugin_config.items():
        assert sim.settings[key] == value, key


def test_int4_awq_plan_says_the_mlp_is_not_fused_and_why():
    plan = make_build_plan(resolve_example("llama3-8b-int4awq-a100"))
    assert plan.plugin_config["use_fused_mlp"] is False
    why = plan.why["use_fused_mlp"]
    assert "fused-mlp-needs-fp8-or-no-quant" in why and "build.py:500" in why and "horizontal fusion" not in why


def test_fp8_plan_keeps_the_fused_mlp_that_gemm_swiglu_needs():
    plan = make_build_plan(resolve_example("llama3-8b-fp8-h100"))
    assert plan.plugin_config["use_fused_mlp"] is True and plan.plugin_config["gemm_swiglu_plugin"] == "fp8"


def test_render_refuses_a_command_that_breaks_a_rule():
    plan = make_build_plan(resolve_example("llama3-8b-fp8-h100"))
    plan.limits["opt_num_tokens"] = 64  # what every command carried before issue 12
    with pytest.raises(TrtpipeError) as info:
        plan.render_command("/c", "/e")
    text = info.value.one_line()
    assert "opt-num-tokens-with-multiple-profiles" in text and "build.py:505" in text and "\n" not in text


def test_render_refuses_a_setting_trtllm_build_would_override():
    plan = make_build_plan(resolve_example("llama3-8b-int4awq-a100"))
    plan.plugin_config["use_fused_mlp"] = True  # the claim trtpipe printed before issue 12
    with pytest.raises(TrtpipeError, match="overrides use_fused_mlp -> disable"):
        plan.render_command("/c", "/e")


def test_int4_awq_with_fp8_kv_turns_paged_context_off_and_refuses_chunked_context(tmp_path, llama8b_config):
    base = (f"model:\n  config: {llama8b_config}\ntarget:\n  gpu: h100-sxm\n"
            "quantization:\n  algo: int4_awq\n  kv_cache: fp8\n")
    plan = make_build_plan(resolve_text(tmp_path, base))
    assert plan.plugin_config["use_paged_context_fmha"] is False
    assert "fp8-context-fmha-needs-fp8-quant" in plan.why["use_paged_context_fmha"]
    with pytest.raises(SpecError) as info:
        make_build_plan(resolve_text(tmp_path, base + "triton:\n  enable_chunked_context: true\n"))
    assert info.value.field == "triton.enable_chunked_context" and "fp8-context-fmha-needs-fp8-quant" in str(info.value)


def test_context_fmha_off_override_turns_paged_context_fmha_off_as_trtllm_build_does(tmp_path, llama8b_config):
    text = (f"model:\n  config: {llama8b_config}\ntarget:\n  gpu: a100-80gb\n"
            "engine:\n  plugins:\n    context_fmha: false\n")
    plan = make_build_plan(resolve_text(tmp_path, text))
    assert plan.plugin_config["use_paged_context_fmha"] is False
    assert "context-fmha-off-disables-fp8-and-paged" in plan.why["use_paged_context_fmha"]


def test_single_profile_override_passes_opt_num_tokens(tmp_path, llama8b_config):
    text = (f"model:\n  config: {llama8b_config}\ntarget:\n  gpu: a100-80gb\n"
            "engine:\n  max_batch_size: 16\n  plugins:\n    multiple_profiles: false\n")
    plan = make_build_plan(resolve_text(tmp_path, text))
    argv = plan.render_command("/c", "/e")
    assert argv[argv.index("--opt_num_tokens") + 1] == "16"


# ------------------------------------------------------------------------------------- resolve / spec-check


def _spec_error(tmp_path, text: str) -> SpecError:
    with pytest.raises(SpecError) as info:
        resolve_text(tmp_path, text)
    return info.value


@pytest.mark.parametrize("key, value", [("kv_cache_type", "continuous"), ("kv_cache_type", "disabled"),
                                        ("paged_kv_cache", "false"), ("gpt_attention_plugin", "disable"),
                                        ("remove_input_padding", "false")])
def test_resolve_refuses_what_inflight_batching_cannot_load(tmp_path, llama8b_config, key, value):
    text = f"model:\n  config: {llama8b_config}\ntarget:\n  gpu: h100-sxm\nengine:\n  plugins:\n    {key}: {value}\n"
    err = _spec_error(tmp_path, text)
    assert err.field == f"engine.plugins.{key}" and err.line == 7
    assert "inflight-batching-needs-paged-kv-packed-input-gpt-attention" in err.one_line()


def test_spec_check_refuses_continuous_kv_cache_in_one_positioned_line(tmp_path, llama8b_config, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"model:\n  config: {llama8b_config}\ntarget:\n  gpu: h100-sxm\n"
                    "engine:\n  plugins:\n    kv_cache_type: continuous\n", encoding="utf-8")
    code = main(["spec-check", str(spec)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert f"{spec}:7:5: engine.plugins.kv_cache_type" in err and "paged KV cache" in err


def test_resolve_refuses_int4_awq_on_b200(tmp_path, llama8b_config):
    err = _spec_error(tmp_path, f"model:\n  config: {llama8b_config}\ntarget:\n  gpu: b200\n"
                                "quantization:\n  algo: int4_awq\n")
    assert err.field == "quantization.algo" and "int-quant-refused-on-sm100" in err.one_line()


@pytest.mark.parametrize("toolchain, refused", [("trtllm-1.1.0", False), ("trtllm-1.2.1", True)])
def test_resolve_knows_streamingllm_per_era(tmp_path, llama8b_config, toolchain, refused):
    text = (f"model:\n  config: {llama8b_config}\ntarget:\n  gpu: h100-sxm\ntoolchain: {toolchain}\n"
            "engine:\n  plugins:\n    streamingllm: true\n")
    if refused:
        assert "streamingllm-removed" in _spec_error(tmp_path, text).one_line()
    else:
        resolve_text(tmp_path, text)


def test_resolve_refuses_fp8_context_fmha_it_would_switch_off(tmp_path, llama8b_config):
    err = _spec_error(tmp_path, f"model:\n  config: {llama8b_config}\ntarget:\n  gpu: h100-sxm\n"
                                "quantization:\n  algo: fp8\nengine:\n  plugins:\n    use_fp8_context_fmha: true\n")
    assert err.field == "engine.plugins.use_fp8_context_fmha"
    assert "fp8-context-fmha-follows-fp8-kv-cache" in err.one_line()


@pytest.mark.parametrize("plugins, rule", [("use_fused_mlp: true", "fused-mlp-needs-fp8-or-no-quant"),
                                           ("reduce_fusion: true", "reduce-fusion-needs-tp-and-architecture")])
def test_spec_check_refuses_an_override_trtllm_build_would_undo(tmp_path, llama8b_config, plugins, rule):
    err = _spec_error(tmp_path, f"model:\n  config: {llama8b_config}\ntarget:\n  gpu: a100-80gb\n"
                                f"quantization:\n  algo: int4_awq\nengine:\n  plugins:\n    {plugins}\n")
    assert err.field == f"engine.plugins.{plugins.split(':')[0]}" and err.line == 9 and f"rule {rule}" in err.one_line()


def test_the_rules_know_the_checkpoint_names_the_quantization_table_gives():
    """BuildFacts take the checkpoint's QuantAlgo names from trtpipe.quant: the names the rules test."""
    names = {f.checkpoint_algo for f in quant.FORMATS.values()}
    assert {"FP8", "W4A16_AWQ", "W4A8_AWQ", "W8A8_SQ_PER_CHANNEL", "W8A16", "NVFP4", None} <= names
    facts = BuildFacts.for_recipe("int4_awq", "fp8", architecture=None, tp_size=1, sm=90)
    assert (facts.quant_algo, facts.kv_cache_quant_algo) == ("W4A16_AWQ", "FP8")
