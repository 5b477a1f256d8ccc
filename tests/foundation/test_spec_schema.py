"""The spec's JSON Schema (`trtpipe spec-schema`, trtpipe.spec_schema): what an editor checks a spec with.

It must accept every spec trtpipe ships and every spec the loader accepts in shape, and refuse what the loader
refuses for its shape (a misspelt key, an unknown backend or quantization format), at the same place.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from trtpipe.errors import SpecError
from trtpipe.resolve import resolve
from trtpipe.shipped import shipped_build_configs_dir
from trtpipe.spec_loader import load_spec

EXAMPLES = sorted((shipped_build_configs_dir() / "examples").glob("*.yaml"))
CONFIG = shipped_build_configs_dir() / "models" / "llama-3-8b" / "config.json"


@pytest.fixture(scope="module")
def schema() -> dict:
    """The schema as the command prints it (what an editor is pointed at)."""
    done = subprocess.run([sys.executable, "-m", "trtpipe.cli", "spec-schema"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    jsonschema.Draft202012Validator.check_schema(found)
    return found


def _errors(schema: dict, data: dict) -> list[tuple[list, str]]:
    return [(list(e.absolute_path), e.validator) for e in jsonschema.Draft202012Validator(schema).iter_errors(data)]


def test_every_shipped_example_spec_passes(schema: dict) -> None:
    assert EXAMPLES
    for path in EXAMPLES:
        assert _errors(schema, yaml.safe_load(path.read_text())) == [], path


@pytest.mark.parametrize(("text", "where", "validator"), [
    ("limits: {max_batch_sise: 8}\n", ["limits"], "additionalProperties"),
    ("backend: {kind: vllm}\n", ["backend"], "anyOf"),
    # another backend's field in the llm-api section, a typo in a section without kind
    ("backend: {kind: llm-api, plugins: {gemm_plugin: auto}}\n", ["backend"], "anyOf"),
    ("backend: {pluginz: {}}\n", ["backend"], "anyOf"),
    ("quantization: {algo: int3}\n", ["quantization", "algo"], "enum"),
    ("quantization: {kv_cache: int2}\n", ["quantization", "kv_cache"], "enum"),
    ("toolchain: trtllm-9.9.9\n", ["toolchain"], "anyOf"),
    ("target: {tp: 0}\n", ["target", "tp"], "minimum"),
    ("modle: {path: m}\n", [], "additionalProperties"),
])
def test_what_trtpipe_refuses_for_its_shape_the_schema_refuses_there(schema: dict, tmp_path: Path, text: str,
                                                                     where: list, validator: str) -> None:
    """The spec is a planning one (model.config) with one bad line; `trtpipe spec-check` refuses it (the loader,
    or resolve for a table's name), and the schema flags the same place."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"model: {{config: {CONFIG}}}\n{text}")
    with pytest.raises(SpecError):
        resolve(load_spec(spec), need_weights=False)
    assert (where, validator) in _errors(schema, yaml.safe_load(spec.read_text()))


def test_a_backend_section_passes_both_with_or_without_its_kind(schema: dict, tmp_path: Path) -> None:
    for text in ("backend: {kind: llm-api}\n", "backend: {plugins: {gemm_plugin: auto}}\n",
                 "backend: {kind: trtllm-build, triton: {max_queue_delay_microseconds: 100}}\n"):
        spec = tmp_path / "spec.yaml"
        spec.write_text(f"model: {{config: {CONFIG}}}\ntarget: {{gpu: h100-sxm}}\n{text}")
        resolve(load_spec(spec), need_weights=False)
        assert _errors(schema, yaml.safe_load(spec.read_text())) == [], text


def test_the_planning_spec_without_the_bad_line_passes_both(schema: dict, tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"model: {{config: {CONFIG}}}\n")
    resolve(load_spec(spec), need_weights=False)
    assert _errors(schema, yaml.safe_load(spec.read_text())) == []


def test_a_gpu_alias_the_loader_takes_is_not_refused(schema: dict) -> None:
    """target.gpu lists the catalog's names as examples only: trtpipe also takes aliases, in any case."""
    assert "h100" in str(schema["$defs"]["TargetSection"]["properties"]["gpu"]["examples"])
    assert _errors(schema, {"model": {"path": "m"}, "target": {"gpu": "H100-SXM"}}) == []


def test_the_schema_can_be_written_to_a_file(tmp_path: Path, schema: dict) -> None:
    out = tmp_path / "schema.json"
    done = subprocess.run([sys.executable, "-m", "trtpipe.cli", "spec-schema", "--output", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text()) == schema and out.stat().st_mode & 0o777 == 0o644


def test_a_directory_as_the_output_is_one_line_and_exit_2(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "trtpipe.cli", "spec-schema", "--output", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and f"--output {tmp_path} is a directory" in lines[0]
    assert list(tmp_path.iterdir()) == []
