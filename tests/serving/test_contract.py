"""The upstream inflight_batcher_llm contract: the table itself, and every repository trtpipe publishes
(cpu-reference and GPU, streaming on and off, ensemble and BLS) declares all of it compatibly."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from trtpipe.serving.contract import Declared, check_model, contract_for, load_contract
from trtpipe.serving.templates import MODEL_NAMES
from trtpipe.serving.validate import validate_repository

TOOLCHAINS = ("trtllm-0.21.0", "trtllm-1.0.0", "trtllm-1.1.0", "trtllm-1.2.1")


def test_contract_covers_every_pinned_toolchain_and_model() -> None:
    from trtpipe.shipped import shipped_build_configs_dir
    from trtpipe.datafiles import read_yaml

    contract = load_contract()
    # the inflight_batcher_llm contract is the trtllm-build path's: lines without that backend (the LLM-API-only
    # preview line) serve the llmapi layout instead
    pinned = {t["name"] for t in read_yaml(shipped_build_configs_dir() / "toolchains.yaml")["toolchains"]
              if any(b["kind"] == "trtllm-build" for b in t["backends"])}
    assert pinned <= set(contract.toolchains) and set(TOOLCHAINS) <= pinned
    assert set(contract.models) == set(MODEL_NAMES)
    for toolchain in contract.toolchains.values():
        # No reading was made at the pinned tag: the table must say so, not pretend otherwise.
        assert toolchain.read_at_tag is False and toolchain.pinned
    for model, table in contract.models.items():
        assert table.inputs and table.outputs, model
        for tensor in [*table.inputs, *table.outputs]:
            assert tensor.at and all(line > 0 for line in tensor.at.values()), (model, tensor.name)
            assert re.fullmatch(r"TYPE_[A-Z0-9]+|\$\{[a-z_]+\}", tensor.dtype), tensor.dtype


def test_issue_12_tensors_are_in_the_contract() -> None:
    """The inputs issue 12 found missing are upstream facts, recorded with their upstream flags."""
    contract = load_contract()
    llm = {t.name: t for t in contract.models["tensorrt_llm"].inputs}
    for name in ("beam_width", "len_penalty", "repetition_penalty", "min_tokens", "presence_penalty",
                 "frequency_penalty", "stop"):
        assert llm[name].optional and llm[name].dims == [1] and llm[name].reshape == [], name
    assert llm["input_ids"].optional  # optional upstream (encoder-decoder and prompt-table requests omit it)
    ensemble = {t.name for t in contract.models["ensemble"].inputs}
    assert {"length_penalty", "repetition_penalty", "min_tokens", "presence_penalty", "frequency_penalty",
            "beam_width"} <= ensemble


def _declared(config_text: str) -> dict[str, dict[str, Declared]]:
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    config = mc.ModelConfig()
    text_format.Parse(config_text, config)
    return {
        direction: {
            t.name: Declared(dtype=mc.DataType.Name(t.data_type), dims=list(t.dims), optional=getattr(t, "optional", False),
                             reshape=list(t.reshape.shape) if t.HasField("reshape") else None)
            for t in tensors
        }
        for direction, tensors in (("input", config.input), ("output", config.output))
    }


def _assert_superset(repo: Path) -> None:
    toolchain = json.loads((repo / "trtpipe.json").read_text())["toolchain"]
    contract = contract_for(toolchain)
    for model in MODEL_NAMES:
        gaps = check_model(contract, model, _declared((repo / model / "config.pbtxt").read_text()))
        assert gaps == [], [g.one_line() for g in gaps]
    assert [i.one_line() for i in validate_repository(repo) if "contract" in i.message] == []


def test_cpu_reference_repository_is_a_superset(example_repo: Path) -> None:
    _assert_superset(example_repo)


def test_cpu_reference_non_streaming_repository_is_a_superset(example_repo: Path, tiny_llama_dir: Path,
                                                               publish_example) -> None:
    repo = publish_example(example_repo.parent.parent.parent, streaming=False, model_dir=tiny_llama_dir)
    assert "decoupled: false" in (repo / "tensorrt_llm" / "config.pbtxt").read_text()
    _assert_superset(repo)


GPU_SPEC = """\
name: tiny-{gpu}
model:
  path: {model}
  dtype: float16
target:
  gpu: {gpu}
  tp: 1
engine:
  max_batch_size: 8
  max_input_len: 256
  max_seq_len: 512
triton:
  streaming: {streaming}
toolchain: {toolchain}
"""


@pytest.mark.parametrize("toolchain", TOOLCHAINS)
@pytest.mark.parametrize("streaming", ["true", "false"])
def test_gpu_repositories_are_supersets(tmp_path: Path, tiny_llama_dir: Path, toolchain: str, streaming: str) -> None:
    from trtpipe.resolve import resolve
    from trtpipe.serving.inflight_repository import publish_repository
    from trtpipe.spec_loader import load_spec

    import dataclasses

    from trtpipe.toolchain import get_toolchain

    spec = tmp_path / "spec.yaml"
    spec.write_text(GPU_SPEC.format(gpu="h100-sxm",
                                    model=tiny_llama_dir, streaming=streaming, toolchain="trtllm-1.2.1"))
    # Each toolchain's contract, on a spec resolved with the newest (resolve refuses building with the
    # toolchains whose converter pins trtpipe's converter is not written for: 0.21.0 and 1.0.0).
    resolved = dataclasses.replace(resolve(load_spec(spec)), toolchain=get_toolchain(toolchain))
    engine = tmp_path / "engine"
    engine.mkdir()
    (engine / "config.json").write_text(json.dumps({
        "version": resolved.toolchain.trtllm_version,
        "pretrained_config": {"architecture": "LlamaForCausalLM", "mapping": {"world_size": 1, "tp_size": 1, "pp_size": 1}},
        "build_config": {"max_batch_size": 8, "max_input_len": 256, "max_seq_len": 512, "max_beam_width": 1},
    }))
    (engine / "rank0.engine").write_bytes(b"stand-in engine: no TensorRT here")
    repo = publish_repository(resolved, engine, "sha256:" + "cd" * 32, "engine-key", tmp_path / "repo")
    assert 'backend: "tensorrtllm"' in (repo / "tensorrt_llm" / "config.pbtxt").read_text()
    _assert_superset(repo)


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


@pytest.mark.parametrize(
    ("model", "old", "new", "field", "problem"),
    [
        ("tensorrt_llm", '{ name: "min_tokens" data_type: TYPE_INT32 dims: [ 1 ] reshape: { shape: [ ] } optional: true },\n',
         "", "input[min_tokens]", "missing"),
        ("tensorrt_llm", '{ name: "presence_penalty" data_type: TYPE_FP32', '{ name: "presence_penalty" data_type: TYPE_FP16',
         "input[presence_penalty]", "dtype TYPE_FP16, upstream TYPE_FP32"),
        ("tensorrt_llm", '{ name: "input_ids" data_type: TYPE_INT32 dims: [ -1 ] optional: true',
         '{ name: "input_ids" data_type: TYPE_INT32 dims: [ -1 ]', "input[input_ids]", "optional upstream"),
        ("tensorrt_llm", '{ name: "beam_width" data_type: TYPE_INT32 dims: [ 1 ] reshape: { shape: [ ] }',
         '{ name: "beam_width" data_type: TYPE_INT32 dims: [ 1 ]', "input[beam_width]", "reshape None, upstream []"),
        ("ensemble", '{ name: "length_penalty" data_type: TYPE_FP32 dims: [ 1 ]',
         '{ name: "length_penalty" data_type: TYPE_FP32 dims: [ 2 ]', "input[length_penalty]", "dims [2], upstream [1]"),
        ("tensorrt_llm_bls", '{ name: "num_output_tokens" data_type: TYPE_INT32 dims: [ 1 ] }',
         '{ name: "num_output_tokens" data_type: TYPE_INT32 dims: [ -1 ] }', "output[num_output_tokens]", "dims [-1], upstream [1]"),
        ("preprocessing", '{ name: "IMAGE_SIZES" data_type: TYPE_INT64 dims: [ -1, 2 ] }',
         '{ name: "IMAGE_SIZES" data_type: TYPE_INT64 dims: [ -1 ] }', "output[IMAGE_SIZES]", "nor any other upstream declaration"),
    ],
)
def test_validate_refuses_each_kind_of_contract_break(repo_copy: Path, model: str, old: str, new: str, field: str,
                                                      problem: str) -> None:
    _edit(repo_copy / model / "config.pbtxt", old, new)
    issues = [i for i in validate_repository(repo_copy) if i.model == model and i.field == field]
    assert issues and problem in issues[0].message, [i.one_line() for i in validate_repository(repo_copy)]
    assert "upstream:" in issues[0].message and "inflight_batcher_llm" in issues[0].message


def test_wider_dims_accepted_only_where_readings_disagree() -> None:
    """IMAGE_URL is [1] in some readings and [-1] in another: ours -1 accepts both. A stable [1] may not widen."""
    contract = load_contract()
    table = contract.models["preprocessing"]
    wide = Declared(dtype="TYPE_STRING", dims=[-1], optional=True, reshape=None)
    ours = {"input": {t.name: Declared(dtype=t.dtype if not t.templated_dtype else "TYPE_FP32", dims=t.dims,
                                       optional=t.optional, reshape=t.reshape) for t in table.inputs},
            "output": {t.name: Declared(dtype=t.dtype, dims=t.dims, optional=False, reshape=None)
                       for t in table.outputs if t.dims != [2]}}
    ours["input"]["IMAGE_URL"] = wide
    assert [g.one_line() for g in check_model(contract, "preprocessing", ours)] == []
    ours["input"]["QUERY"] = Declared(dtype="TYPE_STRING", dims=[-1], optional=False, reshape=None)
    gaps = check_model(contract, "preprocessing", ours)
    assert [g.tensor for g in gaps] == ["QUERY"]
