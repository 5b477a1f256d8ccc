"""`trtpipe migrate SPEC`: a readable plan for every GPU example, --json, and the specs that must change first."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trtpipe.shipped import shipped_build_configs_dir

EXAMPLES = shipped_build_configs_dir() / "examples"
GPU_EXAMPLES = sorted(p.name for p in EXAMPLES.glob("*.yaml") if not p.name.startswith("tiny"))


def trtpipe(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trtpipe.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=120, env={**__import__("os").environ, "COLUMNS": "200"})


@pytest.mark.parametrize("example", GPU_EXAMPLES)
def test_every_gpu_example_gets_a_readable_plan(example: str) -> None:
    result = trtpipe("migrate", EXAMPLES / example)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "trtllm-build -> llm-api: ready" in out.splitlines()[0]
    for must in ("settings that map", "max_batch_size = ", "tensor_parallel_size = ", "kv_cache_config.dtype = ",
                 "settings with no llm-api equivalent", "backend.plugins", "served by: Triton's llmapi Python model",
                 "to migrate: set `kind: llm-api` in the spec's backend section"):
        assert must in out, (example, must)
    report = json.loads(trtpipe("migrate", EXAMPLES / example, "--json").stdout)
    assert report["verdict"] == "ready" and report["from_backend"] == "trtllm-build"
    assert report["llm_args"]["max_seq_len"] == next(m["value"] for m in report["maps"]
                                                     if m["llm_api"].startswith("max_seq_len"))
    assert not [u for u in report["no_equivalent"] if u["blocking"]]


def test_a_spec_with_settings_that_have_no_equivalent_needs_changes(tmp_path: Path) -> None:
    spec = tmp_path / "plugins.yaml"
    text = (EXAMPLES / "llama3-8b-fp8-h100.yaml").read_text().replace("../models", str(EXAMPLES.parent / "models"))
    assert "  kind: trtllm-build\n" in text
    spec.write_text(text.replace("  kind: trtllm-build\n",
                                 "  kind: trtllm-build\n  triton:\n    max_queue_delay_microseconds: 500\n"))
    result = trtpipe("migrate", spec, "--json")
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert report["verdict"] == "needs changes" and report["shape"] == []
    blocking = [u for u in report["no_equivalent"] if u["blocking"]]
    assert [u["spec_field"] for u in blocking] == ["backend.triton.max_queue_delay_microseconds"]
    assert report["llm_args"] is not None  # the mapping is still shown
    text = trtpipe("migrate", spec).stdout
    assert "REMOVE" in text and "backend.triton.max_queue_delay_microseconds" in text


def test_a_spec_in_the_earlier_shape_gets_the_mapping_and_its_fields_as_written(tmp_path: Path) -> None:
    spec = tmp_path / "earlier.yaml"
    spec.write_text(f"name: earlier\nmodel: {{config: {EXAMPLES.parent / 'models' / 'llama-3-8b' / 'config.json'}}}\n"
                    "target: {gpu: h100-sxm}\nbackend: trtllm-build\nengine: {max_batch_size: 16, plugins: {}}\n"
                    "triton: {max_queue_delay_microseconds: 500, enable_kv_cache_reuse: true}\n")
    report = json.loads(trtpipe("migrate", spec, "--json").stdout)
    assert {(m["earlier"], m["today"]) for m in report["shape"]} == {
        ("backend", "backend.kind"), ("engine.max_batch_size", "limits.max_batch_size"),
        ("engine.plugins", "backend.plugins"),
        ("triton.max_queue_delay_microseconds", "backend.triton.max_queue_delay_microseconds"),
        ("triton.enable_kv_cache_reuse", "runtime.kv_cache_reuse")}
    # what llm-api has no place for, named as written; plugins at its default would be dropped: not blocking
    rows = {u["spec_field"]: u["blocking"] for u in report["no_equivalent"]}
    assert [field for field, blocking in rows.items() if blocking] == ["triton.max_queue_delay_microseconds"]
    assert rows["engine.plugins"] is False and rows["triton.tensorrt_llm_instance_count"] is False
    text = trtpipe("migrate", spec).stdout
    assert "the spec's earlier shape" in text and "engine.max_batch_size" in text and "limits.max_batch_size" in text


def test_a_spec_the_pytorch_backend_cannot_run_is_refused_with_the_reason(tmp_path: Path) -> None:
    spec = tmp_path / "b200.yaml"
    spec.write_text(f"name: b200\nmodel: {{config: {EXAMPLES.parent / 'models' / 'llama-3-8b' / 'config.json'}}}\n"
                    "target: {gpu: b200}\nquantization: {algo: fp8}\nruntime: {kv_cache_reuse: true}\n")
    assert trtpipe("migrate", spec).returncode == 0
    spec.write_text(spec.read_text().replace("quantization: {algo: fp8}", "quantization: {algo: w4a8_awq}"))
    result = trtpipe("migrate", spec, "--json")
    report = json.loads(result.stdout)
    assert result.returncode == 1 and report["verdict"] == "refused"
    assert "quantization.algo" in report["refused"] and "w4a8_awq" in report["refused"]


def test_an_invalid_spec_is_one_line_exit_2(tmp_path: Path) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text("model: {config: nowhere.json}\n")
    result = trtpipe("migrate", spec)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1


def test_check_names_the_containers_and_the_backends_each_serves(tmp_path: Path) -> None:
    spec = tmp_path / "h100.yaml"
    spec.write_text(f"name: h100\nmodel: {{config: {EXAMPLES.parent / 'models' / 'llama-3-8b' / 'config.json'}}}\n"
                    "target: {gpu: h100-sxm}\nbackend: llm-api\n")
    report = json.loads(trtpipe("check", "--spec", spec, "--json").stdout)
    row = next(r for r in report["rows"] if r["item"] == "containers")
    assert row["status"] == "OK" and row["expected"] == "a container serving llm-api"
    for tag in ("26.04", "26.05", "26.06", "26.07"):
        assert f"nvcr.io/nvidia/tritonserver:{tag}-trtllm-python-py3: trtllm-build, llm-api" in row["found"]
