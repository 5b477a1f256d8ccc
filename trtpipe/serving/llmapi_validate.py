"""Validate an llmapi repository (trtpipe.serving.llmapi_repository) before any server sees it.

config.pbtxt is parsed with Triton's own schema (tritonclient's model_config_pb2); model.yaml with YAML; both
are held to the facts of build_configs/triton_contracts/llmapi.yaml (`layout`: max_batch_size 0, the
triton_config keys, KIND_CPU, decoupled in both files) and every tensor of its contract. Each issue names the
file or field and the fix, like the inflight_batcher_llm checks in trtpipe.serving.validate.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from trtpipe.serving.templates import PLACEHOLDER

MODEL = "tensorrt_llm"
MODEL_YAML = "tensorrt_llm/1/model.yaml"
ARTIFACT_DIR = "tensorrt_llm/1/checkpoint"
REPUBLISH = "publish the repository again from its spec"


def _contract(checker: Any):
    """The llmapi contract of the manifest's toolchain, or None (a warning says why)."""
    from trtpipe.errors import TrtpipeError
    from trtpipe.serving.contract import contract_for, load_contract
    from trtpipe.serving.layouts import LLMAPI

    toolchain = (checker.manifest or {}).get("toolchain")
    try:
        configs = checker.configs_dir
        return (contract_for(str(toolchain), layout=LLMAPI, configs=configs) if toolchain
                else load_contract(layout=LLMAPI, configs=configs))
    except TrtpipeError as err:
        checker.add("trtpipe.json", "toolchain", f"cannot check the upstream llmapi contract: {err.message}",
                    err.fix or "publish with a toolchain whose line offers the llm-api backend", severity="warning")
        return None


def _config(checker: Any) -> mc.ModelConfig | None:
    repo: Path = checker.repo
    models = sorted(p.name for p in repo.iterdir() if (p / "config.pbtxt").is_file())
    for extra in [m for m in models if m != MODEL]:
        checker.add(extra, "config.pbtxt", "an llmapi repository serves one model, tensorrt_llm", f"remove {extra}/ "
                    f"or {REPUBLISH}")
    path = repo / MODEL / "config.pbtxt"
    if not path.is_file():
        checker.add(MODEL, "config.pbtxt", f"{path} is missing", REPUBLISH)
        return None
    text = path.read_text()
    for lineno, line in enumerate(text.splitlines(), start=1):
        for match in PLACEHOLDER.finditer(line):
            checker.add(MODEL, f"config.pbtxt:{lineno}", f"unfilled template variable {match.group(0)}", REPUBLISH)
            return None
    config = mc.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as err:
        checker.add(MODEL, f"config.pbtxt:{err.GetLine()}:{err.GetColumn()}", f"syntax error: {err}",
                    "fix the config.pbtxt syntax (Triton's protobuf text format) or publish again")
        return None
    if config.name and config.name != MODEL:
        checker.add(MODEL, "name", f"config name {config.name!r} differs from its folder {MODEL!r}", f'set name: "{MODEL}"')
    return config


def _model_yaml(checker: Any) -> dict[str, Any] | None:
    path = checker.repo / MODEL_YAML
    if not path.is_file():
        checker.add(MODEL, "1/model.yaml", "model.yaml is missing (the llmapi model reads its LLM() arguments there)",
                    REPUBLISH)
        return None
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        checker.add(MODEL, "1/model.yaml", f"not valid YAML ({' '.join(str(err).split())[:160]})", REPUBLISH)
        return None
    if not isinstance(data, dict):
        checker.add(MODEL, "1/model.yaml", "not a mapping of LLM() arguments", REPUBLISH)
        return None
    return data


def check_llmapi(checker: Any) -> None:
    """Every problem of the llmapi repository at `checker.repo`, added to `checker` (trtpipe.serving.validate)."""
    manifest = checker.manifest or {}
    reference = bool(manifest.get("reference"))
    contract = _contract(checker)
    layout = (contract.layout if contract is not None else None) or {}
    triton_facts = layout.get("triton_config") or {}
    config = _config(checker)
    settings = _model_yaml(checker)
    repo: Path = checker.repo

    if config is not None:
        if config.backend != "python":
            checker.add(MODEL, "backend", f"backend {config.backend!r}; the llmapi model is a Python-backend model",
                        'set backend: "python"')
        if not (repo / MODEL / "1" / "model.py").is_file():
            checker.add(MODEL, "1/model.py", "the Python model code is missing", REPUBLISH)
        wanted_batch = int(triton_facts.get("max_batch_size", 0))
        if config.max_batch_size != wanted_batch:
            checker.add(MODEL, "max_batch_size", f"{config.max_batch_size}; the llmapi model does not batch requests "
                        f"(upstream model.yaml triton_config.max_batch_size {wanted_batch})",
                        f"set max_batch_size: {wanted_batch} ({REPUBLISH})")
        kind = layout.get("instance_kind", "KIND_CPU")
        for index, group in enumerate(config.instance_group):
            if mc.ModelInstanceGroup.Kind.Name(group.kind) != kind:
                checker.add(MODEL, f"instance_group[{index}].kind",
                            f"{mc.ModelInstanceGroup.Kind.Name(group.kind)}; the llmapi model runs as {kind} (the LLM "
                            "places itself on the GPUs)", f"use kind: {kind}")
        decoupled = config.model_transaction_policy.decoupled
        if "streaming" in manifest and bool(manifest["streaming"]) != decoupled:
            checker.add(MODEL, "model_transaction_policy.decoupled",
                        f"decoupled is {str(decoupled).lower()} but the manifest says runtime.streaming is "
                        f"{str(bool(manifest['streaming'])).lower()}; upstream streams only in decoupled mode",
                        f"set model_transaction_policy {{ decoupled: {str(bool(manifest['streaming'])).lower()} }} "
                        f"({REPUBLISH})")
        if contract is not None:
            _check_tensors(checker, contract, config)

    if settings is not None:
        triton = settings.get("triton_config")
        if not isinstance(triton, dict):
            checker.add(MODEL, "1/model.yaml:triton_config", "missing (upstream's model.py reads max_batch_size and "
                        "decoupled there)", REPUBLISH)
        else:
            allowed = set(triton_facts.get("keys") or ())
            for key in sorted(set(triton) - allowed if allowed else ()):
                checker.add(MODEL, f"1/model.yaml:triton_config.{key}", "not a triton_config key of the llmapi model",
                            f"use only {', '.join(sorted(allowed))}")
            for key in ("max_batch_size", "decoupled"):
                if key not in triton:
                    checker.add(MODEL, f"1/model.yaml:triton_config.{key}", "missing", REPUBLISH)
            if config is not None and "decoupled" in triton and bool(triton["decoupled"]) != \
                    config.model_transaction_policy.decoupled:
                checker.add(MODEL, "1/model.yaml:triton_config.decoupled",
                            f"{bool(triton['decoupled'])} but config.pbtxt says decoupled "
                            f"{config.model_transaction_policy.decoupled}", "make them agree: " + REPUBLISH)
            if config is not None and "max_batch_size" in triton and int(triton["max_batch_size"]) != config.max_batch_size:
                checker.add(MODEL, "1/model.yaml:triton_config.max_batch_size",
                            f"{triton['max_batch_size']} but config.pbtxt says {config.max_batch_size}",
                            "make them agree: " + REPUBLISH)
        _check_model_path(checker, settings, reference, manifest)
    _check_artifact_files(checker, manifest, settings)
    checker.check_toolchain({})


def _check_tensors(checker: Any, contract: Any, config: mc.ModelConfig) -> None:
    from trtpipe.serving.contract import Declared, check_model

    declared = {
        direction: {
            t.name: Declared(dtype=mc.DataType.Name(t.data_type), dims=list(t.dims), optional=bool(getattr(t, "optional", False)),
                             reshape=list(t.reshape.shape) if t.HasField("reshape") else None)
            for t in tensors
        }
        for direction, tensors in (("input", config.input), ("output", config.output))
    }
    for gap in check_model(contract, MODEL, declared):  # type: ignore[arg-type]
        checker.add(MODEL, f"{gap.direction}[{gap.tensor}]",
                    f"breaks the upstream llmapi contract: {gap.problem} (upstream: {gap.source})",
                    "declare it as upstream does (build_configs/triton_contracts/llmapi.yaml); " + REPUBLISH)


def _check_model_path(checker: Any, settings: dict[str, Any], reference: bool, manifest: dict[str, Any]) -> None:
    from trtpipe.reference.hf_loader import is_hf_checkpoint

    model = settings.get("model")
    if not isinstance(model, str) or not model:
        checker.add(MODEL, "1/model.yaml:model", "missing (the checkpoint the LLM loads)", REPUBLISH)
        return
    repo: Path = checker.repo
    if reference:
        target = (repo / MODEL / "1" / model).resolve()
        if Path(model).is_absolute() or not target.is_relative_to((repo / MODEL / "1").resolve()):
            checker.add(MODEL, "1/model.yaml:model", f"{model!r} points outside the model folder",
                        'keep the checkpoint inside the repository ("checkpoint")')
            return
    else:
        mount = manifest.get("container_repo_mount") or "/trtpipe/repo"
        expected = f"{mount}/{ARTIFACT_DIR}"
        if model != expected:
            checker.add(MODEL, "1/model.yaml:model", f"{model!r} is not where the container sees the checkpoint",
                        f'set it to "{expected}"')
            return
        target = repo / ARTIFACT_DIR
    if not is_hf_checkpoint(target):
        checker.add(MODEL, "1/model.yaml:model", f"{target} is not a Hugging Face checkpoint (config.json with "
                    "architectures)", REPUBLISH)
    elif not any(target.glob("*.safetensors")):
        checker.add(MODEL, "1/model.yaml:model", f"{target} holds no .safetensors weights", REPUBLISH)
    elif not (target / "tokenizer.json").is_file():
        checker.add(MODEL, "1/model.yaml:model", f"{target} has no tokenizer.json (the LLM loads the tokenizer "
                    "from the checkpoint folder)", REPUBLISH)


def _check_artifact_files(checker: Any, manifest: dict[str, Any], settings: dict[str, Any] | None) -> None:
    artifact = manifest.get("artifact")
    if not isinstance(artifact, dict):
        checker.add("trtpipe.json", "artifact", "no artifact section (digest, files)", REPUBLISH)
        return
    folder = checker.repo / str(artifact.get("dir") or ARTIFACT_DIR)
    for name in artifact.get("files") or []:
        if not (folder / name).is_file():
            checker.add(MODEL, f"1/checkpoint/{name}", "an artifact file is missing", REPUBLISH)
    if settings is not None:
        tp = int(settings.get("tensor_parallel_size", 1) or 1)
        pp = int(settings.get("pipeline_parallel_size", 1) or 1)
        if int(artifact.get("world_size", tp * pp)) != tp * pp:
            checker.add("trtpipe.json", "artifact.world_size",
                        f"{artifact.get('world_size')} but model.yaml asks for tensor_parallel_size {tp} x "
                        f"pipeline_parallel_size {pp}", REPUBLISH)
