"""Engine validation: an engine that does not match its plan is refused (and so never stored)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtpipe.engine.plan import make_build_plan
from trtpipe.engine.validate import EngineValidationError, validate_engine

from .conftest import resolve_example


def _trtllm_style_engine(root: Path, plan, *, world: int | None = None, **changes) -> Path:
    """An engine directory laid out as trtllm-build writes it (config.json + rank{N}.engine).

    The values are what TRT-LLM records: "auto" plugins resolved to the model dtype, disabled plugins
    as null, kv_cache_type upper-cased, extra fields the plan does not set.
    """
    world = plan.world_size if world is None else world
    plugin_config = {k: (plan.dtype if v == "auto" else v) for k, v in plan.plugin_config.items()}
    plugin_config.update({"paged_kv_cache": True, "nccl_plugin": plan.dtype, "dtype": plan.dtype})
    build_config = {**plan.limits, "kv_cache_type": "PAGED", "plugin_config": plugin_config,
                    "max_prompt_embedding_table_size": 0}
    config = {
        "version": plan.trtllm_version,
        "pretrained_config": {"architecture": "LlamaForCausalLM", "dtype": plan.dtype,
                              "mapping": {"world_size": plan.world_size, "tp_size": plan.tp, "pp_size": plan.pp}},
        "build_config": build_config,
    }
    for dotted, value in changes.items():
        target = config
        *parents, last = dotted.split("__")
        for part in parents:
            target = target[part]
        target[last] = value
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(config), encoding="utf-8")
    for rank in range(world):
        (root / f"rank{rank}.engine").write_bytes(b"plan")
    return root


@pytest.fixture(scope="module")
def plan70b():
    return make_build_plan(resolve_example("llama3-70b-fp8-4xh100"))


def test_matching_engine_is_accepted_and_recorded(tmp_path, plan70b):
    engine = _trtllm_style_engine(tmp_path / "e", plan70b)
    record = validate_engine(engine, plan70b, tensorrt_version="10.14.1.48", gpu_sm=90)
    assert record.world_size == 4 and record.rank_files == [f"rank{i}.engine" for i in range(4)]
    assert record.tensorrt_version == "10.14.1.48" and record.gpu_sm == 90 and not record.reference
    assert record.gpu_product == plan70b.gpu_product


@pytest.mark.parametrize(
    "changes, world, problem",
    [
        ({"version": "1.1.0"}, None, "config.json version 1.1.0 != toolchain TensorRT-LLM 1.2.1"),
        ({"build_config__max_seq_len": 4096}, None, "build_config.max_seq_len 4096 != plan 8192"),
        ({"build_config__plugin_config__remove_input_padding": False}, None, "plugin_config.remove_input_padding"),
        ({"build_config__plugin_config__use_fp8_context_fmha": False}, None, "plugin_config.use_fp8_context_fmha"),
        ({"build_config__kv_cache_type": "CONTINUOUS", "build_config__plugin_config__paged_kv_cache": False}, None,
         "KV cache is not paged"),
        ({"pretrained_config__mapping": {"world_size": 4, "tp_size": 2, "pp_size": 2}}, None, "mapping tp=2 pp=2"),
        ({}, 3, "3 rank{N}.engine file(s) for world size 4 (missing rank3.engine)"),
        ({}, 5, "unexpected rank4.engine"),
    ],
)
def test_mismatches_are_refused(tmp_path, plan70b, changes, world, problem):
    engine = _trtllm_style_engine(tmp_path / "e", plan70b, world=world, **changes)
    with pytest.raises(EngineValidationError) as info:
        validate_engine(engine, plan70b)
    assert problem in info.value.one_line()
    assert "never stored" in info.value.one_line()


def test_missing_config_is_refused(tmp_path, plan70b):
    (tmp_path / "e").mkdir()
    with pytest.raises(EngineValidationError, match="config.json is missing"):
        validate_engine(tmp_path / "e", plan70b)


def test_reference_engine_for_gpu_plan_is_refused(tmp_path, plan70b):
    engine = _trtllm_style_engine(tmp_path / "e", plan70b, trtpipe_reference=True)
    with pytest.raises(EngineValidationError, match="reference engine but the plan targets h100"):
        validate_engine(engine, plan70b)
