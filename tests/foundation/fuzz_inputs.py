"""Fuzz the spec loader (with resolve behind it) and the model-config check with hypothesis, in this process,
measuring each example: run by tests/foundation/test_fuzz_inputs.py as a child process.

    python tests/foundation/fuzz_inputs.py OUT.json WORKDIR [EXAMPLES]

Properties, for every generated input:
- load_spec / resolve either succeed or raise a SpecError (a TrtpipeError, exit 2) whose line is one line and
  starts with `file:line:col: `; nothing else escapes (no RecursionError, ValueError, TypeError ...);
- check_model_config / read_model_config either succeed or raise one InvalidInput line naming the file; a
  config that passes never makes the planners or the reference runtime's config reader raise anything but a
  TrtpipeError;
- per example: Python allocations (tracemalloc peak) and CPU time (process_time: unaffected by other load on
  the machine) are recorded; the parent asserts their bounds and this process's peak RSS.

Hypothesis runs derandomized (the same examples on every machine) and without its example database (nothing
is written into the tree).
"""

from __future__ import annotations

import json
import math
import resource
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trtpipe.config_json import check_model_config, read_model_config
from trtpipe.errors import InvalidInput, SpecError, TrtpipeError
from trtpipe.spec_loader import load_spec

STATS: dict[str, Any] = {"examples": 0, "max_tracemalloc_peak": 0, "max_cpu_s": 0.0, "worst_cpu_input": "",
                         "outcomes": {}}
WORK = Path(".")
VALID_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 2, "hidden_size": 256,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 512,
    "vocab_size": 512, "max_position_embeddings": 2048, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False, "torch_dtype": "float16",
}


def measured(kind: str, shown: str, call) -> None:
    """Run `call` under tracemalloc and process_time; record the outcome's type name."""
    tracemalloc.start()
    started = time.process_time()
    try:
        outcome = call()
    finally:
        cpu = time.process_time() - started
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    STATS["examples"] += 1
    STATS["max_tracemalloc_peak"] = max(STATS["max_tracemalloc_peak"], peak)
    if cpu > STATS["max_cpu_s"]:
        STATS["max_cpu_s"], STATS["worst_cpu_input"] = cpu, f"{kind}: {shown[:200]!r}"
    key = f"{kind}:{outcome}"
    STATS["outcomes"][key] = STATS["outcomes"].get(key, 0) + 1


# ------------------------------------------------------------------------------------------------- YAML

SPEC_WORDS = ["model", "path", "config", "tokenizer", "dtype", "target", "gpu", "tp", "pp", "engine", "plugins",
              "max_batch_size", "max_seq_len", "quantization", "algo", "kv_cache", "calibration", "dataset",
              "release", "gates", "prod", "bench", "triton", "name", "toolchain", "backend", "<<", "x", "~nosuchuser"]
PLAIN = st.sampled_from(["1", "-1", "0", "1e9", "1e999", ".nan", "-.inf", "true", "no", "null", "~", "2001-13-45",
                         "2001-12-14", "0x1F", "0o17", "9" * 5000, "1_000", "float16", "fp8", "h100", "/tmp",
                         "~nosuchuser/x", "a" * 300, "/" + "b" * 255 + "/c", "cpu-reference", "'quoted'",
                         '"a\\0b"', '"\\x00"', '"\\u2028"', "!!binary aGk=", "!!python/object:os.system x",
                         "!!set {a, b}", "!!omap [a: 1]", "!!timestamp 2001-02-30", "!!int 1e3", "!!str 1"])
WORD = st.one_of(st.sampled_from(SPEC_WORDS), st.text(alphabet="abcz_-./~:", min_size=1, max_size=8))


@st.composite
def flow_value(draw, depth: int = 0) -> str:
    """A YAML flow value with anchors and aliases (names a0..a5, defined or not)."""
    choice = draw(st.integers(0, 9 if depth < 6 else 3))
    anchor = f"&a{draw(st.integers(0, 5))} " if draw(st.integers(0, 4)) == 0 else ""
    if choice <= 2:
        return anchor + draw(PLAIN)
    if choice == 3:
        return f"*a{draw(st.integers(0, 5))}"
    if choice <= 6:
        items = draw(st.lists(flow_value(depth + 1), max_size=4))
        return anchor + "[" + ", ".join(items) + "]"
    pairs = draw(st.lists(st.tuples(WORD, flow_value(depth + 1)), max_size=4))
    return anchor + "{" + ", ".join(f"{k}: {v}" for k, v in pairs) + "}"


@st.composite
def yaml_document(draw) -> bytes:
    lines = draw(st.lists(st.tuples(WORD, flow_value()), min_size=1, max_size=6))
    text = "\n".join(f"{k}: {v}" for k, v in lines) + "\n"
    return text.encode("utf-8")


@st.composite
def alias_bomb(draw) -> bytes:
    """Anchors that multiply each other (billion laughs), deep or wide, and deep plain nesting."""
    levels, width = draw(st.integers(1, 14)), draw(st.integers(1, 12))
    kind = draw(st.sampled_from(["laughs", "flow-depth", "block-depth", "merge"]))
    if kind == "laughs":
        text = "a0: &a0 [x]\n" + "".join(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]\n" for i in range(1, levels))
    elif kind == "flow-depth":
        depth = draw(st.integers(1, 20_000))
        text = "model: " + "[" * depth + "]" * depth + "\n"
    elif kind == "block-depth":
        depth = draw(st.integers(1, 300))
        text = "model:\n" + "".join("  " * i + "k:\n" for i in range(1, depth))
    else:
        text = "a0: &a0 {x: 1}\n" + "".join(
            f"a{i}: &a{i} {{<<: [{', '.join([f'*a{i - 1}'] * width)}]}}\n" for i in range(1, levels))
    return (text + "model: {config: " + str(WORK / "config.json") + "}\n").encode()


@st.composite
def schema_spec(draw) -> bytes:
    """A spec of the right shape with hostile values: what gets past the loader into resolve's rules."""
    value = st.one_of(PLAIN, st.integers(-2**70, 2**70).map(str), st.floats(allow_nan=True).map(repr))
    sections = {
        "target": {"gpu": st.sampled_from(["cpu-reference", "h100", "a100-80gb", "l4", "b200", "x"]),
                   "tp": value, "pp": value, "gpu_count": value, "executor": st.sampled_from(["auto", "docker"])},
        "engine": {"max_batch_size": value, "max_input_len": value, "max_seq_len": value, "max_num_tokens": value,
                   "tokens_per_block": value, "max_beam_width": value, "profile": st.sampled_from(["latency", "x"])},
        "quantization": {"algo": st.sampled_from(["none", "fp8", "int4_awq", "w4a8_awq", "int8_sq", "nvfp4"]),
                         "kv_cache": st.sampled_from(["auto", "fp8", "int8"]), "group_size": value},
        "triton": {"max_batch_size": value, "kv_cache_free_gpu_mem_fraction": value,
                   "max_queue_delay_microseconds": value},
    }
    lines = [f"model:\n  config: {WORK / 'config.json'}\n"]
    for section, fields in sections.items():
        chosen = draw(st.lists(st.sampled_from(sorted(fields)), unique=True, max_size=len(fields)))
        if chosen:
            lines.append(f"{section}:\n" + "".join(f"  {name}: {draw(fields[name])}\n" for name in chosen))
    if draw(st.booleans()):
        lines.append("engine:\n  plugins:\n" + "".join(
            f"    {draw(WORD)}: {draw(value)}\n" for _ in range(draw(st.integers(1, 3)))))
    if draw(st.booleans()):
        lines.append(f"toolchain: {draw(st.sampled_from(['trtllm-1.2.1', 'trtllm-0.21.0', 'trtllm-9']))}\n")
    return "".join(lines).encode()


SPEC_INPUTS = st.one_of(yaml_document(), alias_bomb(), schema_spec(), st.binary(max_size=400),
                        st.text(max_size=400).map(lambda t: t.encode("utf-8", "surrogatepass")))


def check_spec(data: bytes) -> str:
    from trtpipe.resolve import resolve

    spec = WORK / "fuzz.yaml"
    spec.write_bytes(data)
    try:
        loaded = load_spec(spec)
        resolve(loaded, need_weights=False)
    except SpecError as err:
        line = err.one_line()
        assert "\n" not in line and line.startswith(f"{spec}:"), line
        parts = line[len(str(spec)) + 1:].split(":", 2)
        assert parts[0].isdigit() and parts[1].isdigit(), line  # file:line:col
        return "SpecError"
    except TrtpipeError as err:  # resolve's errors are positioned SpecErrors; anything else is a bug here
        raise AssertionError(f"not a positioned SpecError: {type(err).__name__}: {err.one_line()}") from None
    return "ok"


# --------------------------------------------------------------------------------------------- configs

JSON_VALUES = st.one_of(st.integers(-2**80, 2**80), st.floats(allow_nan=True), st.booleans(), st.none(),
                        st.text(max_size=12), st.lists(st.integers(), max_size=3),
                        st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
                        st.sampled_from([0, 1, 2, 3, 4, 8, 64, 63, 256, 250, 1024, 1025, 131072, 2**40]))
CONFIG_FIELDS = sorted(set(VALID_CONFIG) | {"head_size", "rotary_pct", "mapping", "quantization", "text_config",
                                            "embedding_sharding_dim", "architecture", "hidden_act", "rope_scaling",
                                            "norm_epsilon", "rotary_base", "share_embedding_table"})


@st.composite
def model_config(draw) -> dict[str, Any]:
    config = dict(VALID_CONFIG)
    for name in draw(st.lists(st.sampled_from(CONFIG_FIELDS), unique=True, max_size=5)):
        if draw(st.integers(0, 5)) == 0:
            config.pop(name, None)
        else:
            config[name] = draw(JSON_VALUES)
    return config


def check_config(config: dict[str, Any]) -> str:
    from trtpipe.checkpoint.hf_source import expected_hf_shapes
    from trtpipe.plan import model_shape
    from trtpipe.reference.runtime import ModelConfig
    from trtpipe.resolve import gemm_input_widths, head_counts

    outcome = "ok"
    try:
        check_model_config(config, "config.json")
    except InvalidInput as err:
        assert "\n" not in err.one_line() and err.one_line().startswith("config.json"), err.one_line()
        outcome = "InvalidInput"
    else:
        # what passes the check never breaks the code that sizes a model from it
        try:
            model_shape(config)
            head_counts(config)
            gemm_input_widths(config, 1)
            expected_hf_shapes(config)
        except TrtpipeError:
            pass
    trtllm = {**config, "architecture": config.get("architecture", "LlamaForCausalLM"),
              "head_size": config.get("head_size", config.get("head_dim"))}
    try:
        ModelConfig.from_checkpoint_config(trtllm, Path("ckpt/config.json"))
    except TrtpipeError as err:
        assert "\n" not in err.one_line()
    # the same through the file reader, as written by json (NaN, Infinity and all)
    path = WORK / "config.json.fuzz"
    path.write_text(json.dumps(config, allow_nan=True))
    try:
        read_model_config(path)
    except InvalidInput as err:
        assert str(path) in err.one_line() and "\n" not in err.one_line()
    return outcome


def main(out: Path, work: Path, examples: int) -> None:
    global WORK
    WORK = work
    (work / "config.json").write_text(json.dumps(VALID_CONFIG))
    def fuzzers(count: int) -> tuple[Any, Any]:
        common = settings(max_examples=count, derandomize=True, database=None, deadline=None,
                          suppress_health_check=list(HealthCheck), print_blob=True)

        @common
        @given(SPEC_INPUTS)
        def fuzz_spec(data: bytes) -> None:
            measured("spec", data.decode("utf-8", "replace"), lambda: check_spec(data))

        @common
        @given(model_config())
        def fuzz_config(config: dict[str, Any]) -> None:
            measured("config", json.dumps(config, allow_nan=True, default=str), lambda: check_config(config))

        return fuzz_spec, fuzz_config

    # The baseline: everything imported (torch with the reference runtime) and hypothesis's own caches built
    # (its unicode tables take ~200 MB the first time), by a short run of both fuzzers; then the real run.
    for fuzz in fuzzers(10):
        fuzz()
    STATS.update(examples=0, max_tracemalloc_peak=0, max_cpu_s=0.0, worst_cpu_input="", outcomes={})
    STATS["baseline_maxrss_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for fuzz in fuzzers(examples):
        fuzz()
    STATS["maxrss_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out.write_text(json.dumps(STATS, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 300)
    assert math.isfinite(STATS["max_cpu_s"])
