"""The spec's backend union and its earlier shape (issue 24): a field another backend owns is refused at its YAML
position by the schema; a spec in the earlier shape (engine:, triton:, backend: NAME) loads as the same spec with
one note, and errors name its fields as written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trtpipe.errors import SpecError
from trtpipe.shipped import shipped_build_configs_dir
from trtpipe.spec_loader import load_spec

CONFIG = shipped_build_configs_dir() / "models" / "llama-3-8b" / "config.json"


def _spec(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(f"model:\n  config: {CONFIG}\ntarget:\n  gpu: h100-sxm\n{text}")
    return path


def _refusal(path: Path) -> str:
    with pytest.raises(SpecError) as info:
        load_spec(path)
    return info.value.one_line()


@pytest.mark.parametrize(("text", "at", "field"), [
    ("backend:\n  kind: llm-api\n  plugins: {gemm_plugin: auto}\n", "7:3", "backend.plugins"),
    ("backend:\n  kind: llm-api\n  build_timeout: 60\n", "7:3", "backend.build_timeout"),
    ("backend:\n  kind: llm-api\n  triton:\n    max_queue_delay_microseconds: 5\n", "7:3", "backend.triton"),
])
def test_another_backends_field_is_refused_where_it_is_written_saying_why(tmp_path: Path, text: str, at: str,
                                                                         field: str) -> None:
    line = _refusal(_spec(tmp_path, text))
    assert line.startswith(f"{tmp_path / 'spec.yaml'}:{at}: {field}: {field} = ")
    assert "has no equivalent with backend llm-api" in line and f"remove {field} (or use backend trtllm-build" in line


def test_an_unknown_backend_kind_and_a_typo_in_a_backend_section_are_refused_at_their_place(tmp_path: Path) -> None:
    line = _refusal(_spec(tmp_path, "backend:\n  kind: vllm\n"))
    assert ": backend: 'vllm' is not a backend; use one of: trtllm-build, reference, llm-api" in line
    line = _refusal(_spec(tmp_path, "backend:\n  kind: trtllm-build\n  plugin: {}\n"))
    assert ":7:3: backend.plugin: unknown key 'plugin'; did you mean 'plugins'?" in line


def test_the_earlier_shape_loads_as_the_same_spec_with_one_note(tmp_path: Path) -> None:
    today = _spec(tmp_path, "limits:\n  max_batch_size: 16\n  profile: latency\nruntime:\n  streaming: false\n"
                            "  kv_cache_free_fraction: 0.8\n  chunked_prefill: true\nbackend:\n  kind: trtllm-build\n"
                            "  build_timeout: 60\n  triton:\n    tensorrt_llm_instance_count: 2\n")
    new = load_spec(today)
    earlier = tmp_path / "earlier.yaml"
    earlier.write_text(f"model:\n  config: {CONFIG}\ntarget:\n  gpu: h100-sxm\nbackend: trtllm-build\nengine:\n"
                       "  max_batch_size: 16\n  profile: latency\n  timeout: 60\ntriton:\n  streaming: false\n"
                       "  kv_cache_free_gpu_mem_fraction: 0.8\n  enable_chunked_context: true\n"
                       "  tensorrt_llm_instance_count: 2\n")
    old = load_spec(earlier)
    assert old.spec == new.spec and new.shape_note is None
    note = old.shape_note
    assert note is not None and "\n" not in note and note.startswith(f"{earlier} is written in the earlier spec shape")
    for move in ("engine.timeout -> backend.build_timeout", "triton.enable_chunked_context -> runtime.chunked_prefill",
                 "triton.tensorrt_llm_instance_count -> backend.triton.tensorrt_llm_instance_count",
                 "backend -> backend.kind"):
        assert move in note
    # the positions of what moved are kept: an error cites the line the user wrote, under the name written
    assert old.position(("runtime", "kv_cache_free_fraction")) == (12, 3)
    assert old.error(("runtime", "kv_cache_free_fraction"), "too much", "lower runtime.kv_cache_free_fraction") \
        .one_line() == f"{earlier}:12:3: triton.kv_cache_free_gpu_mem_fraction: too much; lower " \
                       "triton.kv_cache_free_gpu_mem_fraction"


def test_a_setting_written_in_both_shapes_is_refused_at_the_earlier_one(tmp_path: Path) -> None:
    line = _refusal(_spec(tmp_path, "limits:\n  max_seq_len: 4096\nengine:\n  max_seq_len: 8192\n"))
    assert line == (f"{tmp_path / 'spec.yaml'}:8:3: engine.max_seq_len: engine.max_seq_len is written twice: here, "
                    "in the earlier spec shape, and as limits.max_seq_len; keep only limits.max_seq_len")


def test_in_the_earlier_shape_what_llm_api_ignored_is_dropped_and_what_it_refused_still_is(tmp_path: Path) -> None:
    loaded = load_spec(_spec(tmp_path, "backend: llm-api\nengine:\n  timeout: 60\n  plugins: {}\n"
                                       "triton:\n  tensorrt_llm_instance_count: 1\n"))
    assert loaded.spec.backend.kind == "llm-api" and "engine.timeout dropped" in (loaded.shape_note or "")
    line = _refusal(_spec(tmp_path, "backend: llm-api\ntriton:\n  tensorrt_llm_instance_count: 2\n"))
    assert ":7:3: triton.tensorrt_llm_instance_count: triton.tensorrt_llm_instance_count = 2 has no equivalent " \
           "with backend llm-api" in line


def test_spec_check_prints_the_earlier_shape_note(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "engine:\n  max_batch_size: 16\n")
    result = subprocess.run([sys.executable, "-m", "trtpipe.cli", "spec-check", str(spec)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "note: " + str(spec) + " is written in the earlier spec shape; it loads as: engine.max_batch_size -> " \
           "limits.max_batch_size" in result.stdout


def test_the_repository_key_keeps_its_field_names() -> None:
    """The publish stage's key hashes serving_settings(): the names the earlier triton section gave the runtime
    knobs are kept, so an engine backend's repository keeps its key across the spec's change of shape."""
    spec = load_spec(shipped_build_configs_dir() / "examples" / "llama3-8b-fp8-h100.yaml").spec
    assert sorted(spec.serving_settings()) == sorted([
        "streaming", "tensorrt_llm_instance_count", "preprocessing_instance_count", "postprocessing_instance_count",
        "max_batch_size", "kv_cache_free_gpu_mem_fraction", "batch_scheduler_policy", "enable_chunked_context",
        "enable_kv_cache_reuse", "max_queue_delay_microseconds"])


@pytest.mark.parametrize(("text", "expected"), [
    ("backend: [1, 2]\nengine: {max_batch_size: 3}\n", ":5:1: backend: expected a mapping of keys, got list"),
    ("engine: 5\n", ":5:1: engine: expected a mapping of keys, got 5; write its fields under limits:, runtime: "
                    "and backend:"),
    ("backend: {kind: [1]}\n", ":5:1: backend: '[1]' is not a backend"),
    ("limits: 3\nengine: {max_seq_len: 9}\n", ":5:1: limits: expected a mapping of keys, got 3"),
])
def test_a_malformed_mix_of_shapes_is_one_positioned_line(tmp_path: Path, text: str, expected: str) -> None:
    assert expected in _refusal(_spec(tmp_path, text))
