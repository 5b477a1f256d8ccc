"""The per-version TorchLlmArgs tables and the check every llm_args.json / model.yaml we write passes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from trtpipe.backend_options import LlmApiOptions
from trtpipe.errors import InvalidInput
from trtpipe.llm_api.args import check_llm_args, llm_args_problems, load_args_table, tables_dir
from trtpipe.resolve import resolve
from trtpipe.spec_loader import load_spec
from trtpipe.shipped import shipped_build_configs_dir
from trtpipe.toolchain import load_toolchains

EXAMPLES = shipped_build_configs_dir() / "examples"
TABLES = sorted(p.stem for p in tables_dir().glob("*.yaml"))


def test_every_llm_api_backend_names_a_table_and_every_table_a_toolchain() -> None:
    toolchains = load_toolchains(include_preview=True)
    named = {t.backend("llm-api").args for t in toolchains.values() if t.backend("llm-api") is not None}
    assert named == set(TABLES) and "trtllm-1.2.1" in named
    for name in TABLES:
        table = load_args_table(name)
        assert table.toolchain == name and toolchains[name].trtllm_version == table.trtllm_version


@pytest.mark.parametrize("name", TABLES)
def test_every_field_is_sourced_and_every_nested_config_is_listed(name: str) -> None:
    table = load_args_table(name)
    assert {"file", "read", "verified"} <= set(table.sources["llm_args"])
    assert table.sources["quantization"]["commit"] == "09d4c79ba941a5c2c62c878c3572c0dcc8b85efa"
    for field_name, spec in table.fields.items():
        if table.complete:
            assert spec.cite, f"{name}: {field_name} names no class or validator"
        if spec.kind == "config":
            assert spec.config in table.configs, f"{name}: {field_name} -> {spec.config}"
        if spec.kind == "choice":
            assert spec.choices and (spec.default is None or spec.default in spec.choices), field_name
    # The fields trtpipe writes are in every table.
    for written in ("tensor_parallel_size", "pipeline_parallel_size", "dtype", "max_batch_size", "max_num_tokens",
                    "max_seq_len", "max_input_len", "max_beam_width", "kv_cache_config", "enable_chunked_prefill",
                    "scheduler_config", "cuda_graph_config", "trust_remote_code"):
        assert written in table.fields, (name, written)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ({"max_batch_sizes": 8}, "max_batch_sizes: not a field of TorchLlmArgs in TensorRT-LLM 1.2.1"),
        ({"max_batch_size": "8"}, "max_batch_size: must be an integer, not '8'"),
        ({"max_batch_size": True}, "max_batch_size: must be an integer, not True"),
        ({"enable_chunked_prefill": 1}, "enable_chunked_prefill: must be true or false"),
        ({"kv_cache_config": {"dtyp": "fp8"}}, "kv_cache_config.dtyp: not a field of KvCacheConfig"),
        ({"kv_cache_config": {"dtype": "int8"}}, "kv_cache_config.dtype: must be one of auto, fp8"),
        ({"kv_cache_config": {"free_gpu_memory_fraction": 1.5}}, "free_gpu_memory_fraction: must be at most 1"),
        ({"kv_cache_config": "fp8"}, "kv_cache_config: must be a mapping of KvCacheConfig fields"),
        ({"tensor_parallel_size": 0}, "tensor_parallel_size: must be at least 1"),
        ({"cuda_graph_config": {"batch_sizes": []}}, "cuda_graph_config.batch_sizes: must be a non-empty list"),
        ({"lora_config": {"max_lora_rank": 8}}, "lora_config: holds a Python object"),
        ({"scheduler_config": {"capacity_scheduler_policy": "FIFO"}}, "must be one of MAX_UTILIZATION"),
        ({"stream_interval": 0}, "stream_interval: must be at least 1"),
    ],
)
def test_a_wrong_key_or_type_is_refused_in_one_line(args: dict, says: str) -> None:
    table = load_args_table("trtllm-1.2.1")
    with pytest.raises(InvalidInput) as info:
        check_llm_args(args, table, where="llm_args.json")
    line = info.value.one_line()
    assert says in line and "\n" not in line and line.startswith("llm_args.json: ")
    assert "build_configs/llm_api_args/trtllm-1.2.1.yaml" in line


def test_the_preview_table_refuses_what_it_did_not_read() -> None:
    table = load_args_table("trtllm-1.4.0rc4")
    assert not table.complete
    assert llm_args_problems({"custom_tokenizer": "x", "pp_partition": [2, 2]}, table) == []
    assert llm_args_problems({"custom_tokenizer": "x"}, load_args_table("trtllm-1.2.1")) != []  # new in 1.4.0rc4
    problems = llm_args_problems({"disable_overlap_scheduler": True}, table)
    assert problems == ["disable_overlap_scheduler: not a field of TorchLlmArgs in TensorRT-LLM 1.4.0rc4 "
                        "(as far as trtpipe's table of this preview line was read)"]
    assert table.unverified({"max_batch_size": 4, "tensor_parallel_size": 1, "kv_cache_config": {"dtype": "auto"}}) \
        == ["max_batch_size", "kv_cache_config.dtype"]


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("*.yaml") if not p.name.startswith("tiny")))
def test_every_gpu_example_as_llm_api_derives_arguments_the_table_takes(example: str) -> None:
    loaded = load_spec(EXAMPLES / example)
    loaded = dataclasses.replace(loaded, spec=loaded.spec.model_copy(update={"backend": LlmApiOptions()}))
    resolved = resolve(loaded, need_weights=False)
    plan = resolved.llm_api
    assert plan is not None and plan.toolchain == "trtllm-1.2.1"
    assert llm_args_problems(plan.args, load_args_table("trtllm-1.2.1")) == []
    spec = loaded.spec
    assert plan.args["tensor_parallel_size"] == spec.target.tp
    assert plan.args["max_batch_size"] == spec.limits.max_batch_size
    assert plan.args["cuda_graph_config"] == {"max_batch_size": spec.limits.max_batch_size, "enable_padding": True}
    assert plan.args["kv_cache_config"]["dtype"] == ("fp8" if spec.quantization.kv_cache == "fp8" else "auto")
    assert "model" not in plan.args  # no path in the artifact: the repository writer adds it
    # every argument names the spec field it comes from (or says trtpipe sets it)
    assert {s.arg.split(".")[0] for s in plan.sources} == set(plan.args)


def test_the_tiny_llm_api_spec_has_no_cuda_graphs_and_passes_the_table(tiny_spec) -> None:
    resolved = resolve(load_spec(tiny_spec()))
    assert "cuda_graph_config" not in resolved.llm_api.args
    assert llm_args_problems(resolved.llm_api.args, load_args_table("trtllm-1.2.1")) == []


def test_the_table_refuses_what_trtpipe_would_never_write(tmp_path: Path) -> None:
    """A damaged table is an integrity error naming the file, not a crash."""
    from trtpipe.errors import IntegrityError
    from trtpipe.llm_api.args import _load

    bad = tmp_path / "bad.yaml"
    bad.write_text("toolchain: x\nfields: {a: {kind: banana}}\n")
    with pytest.raises(IntegrityError) as info:
        _load(str(bad))
    assert str(bad) in info.value.one_line()
