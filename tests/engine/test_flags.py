"""The trtllm-build flag contract per pinned TRT-LLM version, and every rendered command against it."""

from __future__ import annotations

import pytest

from trtpipe.trtllm_build.flags import known_contracts, load_contract
from trtpipe.engine.plan import make_build_plan
from trtpipe.errors import TrtpipeError
from trtpipe.toolchain import load_toolchains

from .conftest import GPU_EXAMPLES, resolve_example, with_toolchain

TOOLCHAINS = sorted(load_toolchains())


def test_every_pinned_toolchain_has_a_contract():
    assert set(TOOLCHAINS) <= set(known_contracts())
    for name in TOOLCHAINS:
        contract = load_contract(name)
        assert contract.toolchain == name
        assert contract.trtllm_version == load_toolchains()[name].trtllm_version


def test_unknown_toolchain_contract_is_a_clear_error():
    with pytest.raises(TrtpipeError, match="no trtllm-build flag contract for toolchain 'trtllm-9.9.9'"):
        load_contract("trtllm-9.9.9")


@pytest.mark.parametrize("toolchain", TOOLCHAINS)
@pytest.mark.parametrize(
    "argv, problem",
    [
        (["trtllm-build", "--strongly_typed"], "--strongly_typed is not a trtllm-build flag"),
        (["trtllm-build", "--max_output_len", "512"], "use --max_seq_len"),
        (["trtllm-build", "--tp_size", "2"], "mapping"),
        (["trtllm-build", "--use_custom_all_reduce", "enable"], "runtime option"),
        (["trtllm-build", "--context_fmha_fp32_acc", "enable"], "bert_context_fmha_fp32_acc"),
        (["trtllm-build", "--gemm_plugin", "fp16"], "choose one of"),
        (["trtllm-build", "--kv_cache_type", "contiguous"], "choose one of"),
        (["trtllm-build", "--low_latency_gemm_plugin", "float16"], "choose one of"),
        (["trtllm-build", "--gather_all_token_logits", "enable"], "unexpected positional argument"),
        (["trtllm-build", "--tokens_per_block", "48"], "power of two"),
        (["trtllm-build", "--max_batch_size", "0"], "below the minimum"),
        (["trtllm-build", "--max_batch_size", "many"], "integer"),
        (["trtllm-build", "--workers", "1", "--workers", "2"], "given twice"),
    ],
)
def test_contract_refuses_bad_commands(toolchain, argv, problem):
    problems = load_contract(toolchain).check_command(argv)
    assert any(problem in p for p in problems), problems


@pytest.mark.parametrize("toolchain", ["trtllm-0.21.0", "trtllm-1.0.0", "trtllm-1.1.0"])
def test_auto_parallel_flags_exist_until_the_1_2_line(toolchain):
    # build.py@008b2b8 parse_arguments() lines 304-324; removed by TRT-LLM PR #8329
    contract = load_contract(toolchain)
    assert contract.check_command(["trtllm-build", "--auto_parallel", "2", "--gpus_per_node", "8",
                                   "--cluster_key", "H100-SXM"]) == []


def test_auto_parallel_flags_removed_in_1_2_with_the_pr_named():
    problems = load_contract("trtllm-1.2.1").check_command(["trtllm-build", "--auto_parallel", "2"])
    assert problems and "PR #8329" in problems[0]


@pytest.mark.parametrize("toolchain", TOOLCHAINS)
def test_streamingllm_is_a_parser_flag_in_every_era(toolchain):
    # what build_model() does with it is a rule (streamingllm-llama-only / streamingllm-removed), not a flag fact
    assert load_contract(toolchain).check_value("streamingllm", "enable") is None


def _independent_check(contract, argv: list[str]) -> None:
    """Walk argv without the contract's own parser: every flag known, every value allowed."""
    assert argv[0] == "trtllm-build"
    i = 1
    while i < len(argv):
        flag = argv[i]
        assert flag.startswith("--"), argv
        spec = contract.flags[flag[2:]]  # KeyError = an unknown flag
        if spec.kind == "switch":
            i += 1
            continue
        value = argv[i + 1]
        if spec.kind == "choice":
            assert value in spec.choices, (flag, value)
        elif spec.kind == "int":
            assert int(value) >= (spec.min or 0), (flag, value)
        i += 2


@pytest.mark.parametrize("toolchain", TOOLCHAINS)
@pytest.mark.parametrize("example", GPU_EXAMPLES + ("tiny-cpu-planning",))
@pytest.mark.parametrize("profile", ["throughput", "latency"])
def test_every_example_renders_only_known_flags(toolchain, example, profile, tmp_path):
    if example == "tiny-cpu-planning":
        from .conftest import REPO, resolve_text

        resolved = resolve_text(
            tmp_path,
            f"model:\n  config: {REPO / 'build_configs/models/llama-3-8b/config.json'}\n"
            "target:\n  gpu: cpu-reference\nengine:\n  max_batch_size: 4\n  max_input_len: 256\n  max_seq_len: 512\n",
        )
    else:
        resolved = resolve_example(example)
    resolved.spec.limits.profile = profile
    plan = make_build_plan(with_toolchain(resolved, toolchain))
    argv = plan.render_command("/ckpt", "/engine")
    contract = load_contract(toolchain)
    assert contract.check_command(argv) == []
    _independent_check(contract, argv)
    # in-flight batching requirements are always explicit on the command line
    pairs = dict(zip(argv[1::2], argv[2::2]))
    assert pairs["--gpt_attention_plugin"] != "disable"
    assert pairs["--remove_input_padding"] == "enable"
    assert pairs["--kv_cache_type"] == "paged"
