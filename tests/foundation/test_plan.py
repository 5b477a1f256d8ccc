"""`trtpipe plan`: the acceptance figures, verdicts and suggestions, through the real CLI."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtpipe.plan import memory_plan, model_shape
from trtpipe.resolve import resolve
from trtpipe.spec_loader import load_spec


def _spec(tmp_path: Path, body: str) -> Path:
    spec = tmp_path / "spec.yaml"
    spec.write_text(body)
    return spec


def test_llama2_13b_fp16_example(cli, examples_dir: Path) -> None:
    result = cli("plan", examples_dir / "llama2-13b-fp16-a100.yaml", "--json")
    plan = result.json()
    assert plan["kv_bytes_per_token"] == 819_200  # 2 x 40 layers x 40 heads x 128 x 2 bytes
    assert 25.5e9 < plan["weight_bytes_total"] < 26.5e9  # ~26 GB of FP16 weights
    assert plan["weight_precision"] == "float16"
    # 16 sequences of 4096 tokens do not fit next to 26 GB of weights on a 40 GB A100
    assert plan["fits"] is False and plan["verdict"] == "does not fit"
    assert result.code == 1
    assert plan["tokens_needed"] == 16 * 4096
    assert plan["sequences_at_max_seq_len"] == plan["kv_tokens"] // 4096
    assert plan["kv_tokens"] * plan["kv_bytes_per_token_per_gpu"] <= plan["kv_cache_bytes_per_gpu"]
    # TPOT floor = weight bytes / 1555 GB/s
    assert plan["tpot_floor_ms"] == pytest.approx(plan["weight_bytes_per_gpu"] / 1555e9 * 1000, rel=1e-3)
    changes = {s["change"]: s for s in plan["suggestions"]}
    assert any("INT4-AWQ" in c for c in changes), changes
    # SM80: no FP8 weights or FP8 KV cache; no INT8 KV either (the pinned converter refuses it)
    assert not any("FP8" in c or "INT8" in c for c in changes), changes
    tp2 = next(s for c, s in changes.items() if "tp=2" in c)
    assert tp2["gpu_count"] == 2 and tp2["weight_bytes_per_gpu"] < plan["weight_bytes_per_gpu"]
    awq = next(s for c, s in changes.items() if "INT4-AWQ" in c)
    assert awq["weight_bytes_per_gpu"] < plan["weight_bytes_per_gpu"] / 3
    assert awq["kv_tokens"] > plan["kv_tokens"]
    assert any(s["fits"] for s in plan["suggestions"])
    assert "overhead" in plan["overhead_assumption"]


def test_llama3_8b_fp16_kv_per_token(cli, tmp_path: Path, models_dir: Path) -> None:
    spec = _spec(
        tmp_path,
        f"model:\n  config: {models_dir / 'llama-3-8b' / 'config.json'}\n  dtype: float16\n"
        "target:\n  gpu: h100-sxm\n",
    )
    result = cli("plan", spec, "--json")
    plan = result.json()
    assert plan["kv_bytes_per_token"] == 131_072  # 2 x 32 x 8 KV heads x 128 x 2 bytes
    assert plan["fits"] is True and result.code == 0
    assert 15.5e9 < plan["weight_bytes_total"] < 16.5e9
    assert plan["suggestions"] == []


def test_fp8_kv_halves_kv_bytes(cli, examples_dir: Path) -> None:
    plan = cli("plan", examples_dir / "llama3-8b-fp8-h100.yaml", "--json").json()
    assert plan["kv_cache_dtype"] == "fp8"
    assert plan["kv_bytes_per_token"] == 131_072 // 2
    assert plan["fits"] is True


def test_tensor_parallel_splits_weights_and_kv(cli, examples_dir: Path) -> None:
    plan = cli("plan", examples_dir / "llama3-70b-fp8-4xh100.yaml", "--json").json()
    assert plan["gpu_count"] == 4
    assert plan["kv_bytes_per_token_per_gpu"] * 4 == plan["kv_bytes_per_token"]
    assert plan["weight_bytes_per_gpu"] < plan["weight_bytes_total"] / 3
    assert plan["fits"] is True


def test_weights_that_do_not_fit_one_gpu(cli, tmp_path: Path, models_dir: Path) -> None:
    spec = _spec(
        tmp_path,
        f"model:\n  config: {models_dir / 'llama-3-70b' / 'config.json'}\ntarget:\n  gpu: h100-sxm\n",
    )
    result = cli("plan", spec, "--json")
    plan = result.json()
    assert result.code == 1 and plan["fits"] is False
    assert "exceed" in plan["reason"]
    fitting = [s for s in plan["suggestions"] if s["fits"]]
    assert fitting, plan["suggestions"]
    assert any(s["spec_changes"].get("target.tp") for s in fitting)


def test_plan_table_output(cli, examples_dir: Path) -> None:
    result = cli("plan", examples_dir / "llama2-13b-fp16-a100.yaml")
    assert result.code == 1
    assert "819,200" in result.out and "does not fit" in result.out and "INT4-AWQ" in result.out


def test_cpu_reference_plan_uses_host_memory(cli, tmp_path: Path, models_dir: Path) -> None:
    spec = _spec(
        tmp_path,
        f"model:\n  config: {models_dir / 'qwen2.5-7b' / 'config.json'}\ntarget:\n  gpu: cpu-reference\n"
        "engine:\n  max_batch_size: 1\n  max_input_len: 64\n  max_seq_len: 128\n",
    )
    plan = cli("plan", spec, "--json").json()
    assert plan["target"] == "cpu-reference" and plan["tpot_floor_ms"] is None
    assert plan["kv_bytes_per_token"] == 2 * 28 * 4 * 128 * 2
    assert plan["model"]["qkv_bias"] is True


@pytest.mark.parametrize(
    "name,params_b",
    [("llama-2-13b", 13.0), ("llama-3-8b", 8.0), ("llama-3-70b", 70.6), ("mistral-7b", 7.2), ("qwen2.5-7b", 7.6)],
)
def test_parameter_counts_of_shipped_configs(models_dir: Path, name: str, params_b: float) -> None:
    import json

    shape = model_shape(json.loads((models_dir / name / "config.json").read_text()))
    assert shape.total_params / 1e9 == pytest.approx(params_b, abs=0.1)


def test_memory_plan_api(examples_dir: Path) -> None:
    plan = memory_plan(resolve(load_spec(examples_dir / "llama3-8b-int4awq-a100.yaml"), need_weights=False))
    assert plan.weight_precision.startswith("int4_awq")
    assert plan.kv_cache_dtype == "float16"
    assert plan.model_dump()["fits"] is True
