"""Publish a Triton model repository in TensorRT-LLM's `llmapi` layout for one LLM-API artifact.

Layout written into `out_dir` (facts: build_configs/triton_contracts/llmapi.yaml, `layout`):
    tensorrt_llm/config.pbtxt       Python backend, max_batch_size 0, decoupled = runtime.streaming, every tensor
                                    of the llmapi contract, the identity parameters
    tensorrt_llm/1/model.yaml       `model` (the artifact, below), the artifact's llm_args.json (the LLM() keyword
                                    arguments) and `triton_config` {max_batch_size: 0, decoupled}
    tensorrt_llm/1/model.py         GPU: loads the pinned container's own upstream llmapi model; cpu-reference:
                                    trtpipe's reference runtime behind the same tensors
    tensorrt_llm/1/checkpoint/*     the artifact's files (HF checkpoint, tokenizer, llm_args.json), hard-linked
                                    from the store like engine files, so the repository is self-contained
    trtpipe.json                    name, release gates, artifact digest, toolchain, target, serving container
model.yaml's `model` is relative ("checkpoint", resolved against the model's version folder) on cpu-reference and
the container path (/trtpipe/repo/tensorrt_llm/1/checkpoint) on GPU targets, where upstream's model.py hands it to
LLM() as it is. Nothing in the output depends on when or where it was published.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import yaml

from trtpipe.errors import IntegrityError, InvalidInput, UsageError
from trtpipe.model_folder import SERVING_TOKENIZER_FILE, TOKENIZER_FILES
from trtpipe.serving import identity, templates
from trtpipe.serving.repository_files import (
    CONTAINER_REPO_MOUNT,
    MANIFEST_FORMAT,
    STORE_MANIFEST,
    manifest_header,
    place_file,
    write_repository_atomically,
)

LAYOUT = "llmapi"
MODEL = "tensorrt_llm"
VERSION_DIR = f"{MODEL}/1"
ARTIFACT_SUBDIR = "checkpoint"
ARTIFACT_DIR = f"{VERSION_DIR}/{ARTIFACT_SUBDIR}"
MODEL_YAML = "model.yaml"
LLM_ARGS_FILE = "llm_args.json"
HF_QUANT_CONFIG = "hf_quant_config.json"
# Where the Triton TRT-LLM container keeps TensorRT-LLM's own llmapi model (llmapi.yaml `pinned_container_model_dir`).
UPSTREAM_MODEL_DIR = "/app/all_models/llmapi/tensorrt_llm/1"
# model.yaml keys trtpipe writes itself; an artifact's llm_args.json must not set them.
RESERVED_KEYS = ("model", "triton_config")


def _bool(value: bool) -> str:
    return "true" if value else "false"


def read_llm_args(artifact_dir: Path) -> dict[str, Any]:
    path = artifact_dir / LLM_ARGS_FILE
    try:
        args = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise IntegrityError(f"{path} not found: not an LLM-API artifact", path=str(path),
                             fix="rebuild the artifact (its stage writes llm_args.json)") from None
    except json.JSONDecodeError as err:
        raise IntegrityError(f"{path}: not valid JSON ({err})", path=str(path), fix="rebuild the artifact") from None
    if not isinstance(args, dict):
        raise IntegrityError(f"{path}: not a JSON object of LLM() arguments", path=str(path), fix="rebuild the artifact")
    reserved = [key for key in RESERVED_KEYS if key in args]
    if reserved:
        raise IntegrityError(f"{path}: sets {reserved[0]!r}, which the repository writer owns", path=str(path),
                             fix="rebuild the artifact (llm_args.json holds LLM() arguments only)")
    return args


def check_artifact(artifact_dir: Path) -> list[str]:
    """The artifact's files (sorted names); refuses a folder that is not a complete LLM-API artifact."""
    from trtpipe.reference.hf_loader import is_hf_checkpoint

    if not artifact_dir.is_dir():
        raise IntegrityError(f"{artifact_dir} is not a directory", path=str(artifact_dir), fix="rebuild the artifact")
    if not is_hf_checkpoint(artifact_dir):
        raise IntegrityError(f"{artifact_dir}/config.json is not a Hugging Face model config (no architectures)",
                             path=str(artifact_dir), fix="rebuild the artifact")
    names = []
    for path in sorted(artifact_dir.iterdir()):
        if path.name == STORE_MANIFEST:
            continue  # the store's bookkeeping is not part of the artifact
        if not path.is_file():
            raise IntegrityError(f"{path}: an LLM-API artifact holds files only", path=str(path), fix="rebuild the artifact")
        if path.name in ("model.py", MODEL_YAML):
            raise IntegrityError(f"{path}: an artifact must not contain {path.name}", path=str(path),
                                 fix="rebuild the artifact")
        names.append(path.name)
    if not any(n.endswith(".safetensors") for n in names):
        raise IntegrityError(f"{artifact_dir} holds no .safetensors weights", path=str(artifact_dir),
                             fix="rebuild the artifact")
    if SERVING_TOKENIZER_FILE not in names:
        raise InvalidInput(f"{artifact_dir}: no {SERVING_TOKENIZER_FILE} (the LLM loads its tokenizer from the "
                           "checkpoint folder)", fix="rebuild the artifact from a model with a fast tokenizer")
    read_llm_args(artifact_dir)
    return names


def template_values(resolved: Any) -> dict[str, str]:
    return {
        "decoupled_mode": _bool(resolved.spec.runtime.streaming),
        "upstream_model_dir": UPSTREAM_MODEL_DIR,
    }


def model_yaml(resolved: Any, llm_args: dict[str, Any]) -> str:
    """model.yaml: `model`, the LLM() arguments (sorted), then `triton_config`; stable text for the same inputs."""
    reference = resolved.spec.target.is_cpu_reference
    model = ARTIFACT_SUBDIR if reference else f"{CONTAINER_REPO_MOUNT}/{ARTIFACT_DIR}"
    header = ("# Written by trtpipe from the artifact's llm_args.json: every key but triton_config is an LLM() argument\n"
              "# (TensorRT-LLM's llmapi model.py passes them through update_llm_args_with_extra_dict).\n")
    body = yaml.safe_dump({"model": model}, sort_keys=False)
    body += yaml.safe_dump(dict(sorted(llm_args.items())), sort_keys=True) if llm_args else ""
    body += yaml.safe_dump({"triton_config": {"max_batch_size": 0, "decoupled": bool(resolved.spec.runtime.streaming)}},
                           sort_keys=False)
    return header + body


def _quantization(artifact_dir: Path) -> dict[str, Any]:
    from trtpipe.reference.hf_loader import hf_quantization

    algo, kv_algo, section = hf_quantization(artifact_dir)
    return {"quant_algo": algo, "kv_cache_quant_algo": kv_algo, "group_size": section.get("group_size")}


def build_manifest(resolved: Any, artifact_dir: Path, artifact_digest: str, files: list[str],
                   llm_args: dict[str, Any], repository_key: str | None) -> dict[str, Any]:
    spec = resolved.spec
    tp = int(llm_args.get("tensor_parallel_size", 1) or 1)
    pp = int(llm_args.get("pipeline_parallel_size", 1) or 1)
    return {
        "format": MANIFEST_FORMAT,
        "layout": LAYOUT,
        "backend": "llm-api",
        **manifest_header(resolved, repository_key),
        "artifact": {
            "digest": artifact_digest,
            "dir": ARTIFACT_DIR,
            "files": files,
            "tp": tp,
            "pp": pp,
            "world_size": tp * pp,
            **_quantization(artifact_dir),
        },
        "streaming": spec.runtime.streaming,
        "triton_max_batch_size": 0,
        "models": [MODEL],
        "tokenizer_files": [n for n in TOKENIZER_FILES if n in files],
    }


def _write(resolved: Any, artifact_dir: Path, files: list[str], llm_args: dict[str, Any], root: Path,
           identity_values: dict[str, str]) -> None:
    reference = resolved.spec.target.is_cpu_reference
    template_root = templates.template_root(LAYOUT)
    config_source = f"{LAYOUT}/{MODEL}/config.pbtxt"
    text = templates.render((template_root / MODEL / "config.pbtxt").read_text(), template_values(resolved),
                            source=config_source)
    text = identity.add_parameters(text, identity_values, where=config_source)
    version_dir = root / VERSION_DIR
    (root / ARTIFACT_DIR).mkdir(parents=True)
    (root / MODEL / "config.pbtxt").write_text(text)
    code = template_root / templates.LLMAPI_SOURCES["reference" if reference else "gpu"] / "1" / "model.py"
    shutil.copy2(code, version_dir / "model.py")
    (version_dir / MODEL_YAML).write_text(model_yaml(resolved, llm_args))
    for name in files:
        place_file(artifact_dir / name, root / ARTIFACT_DIR / name)


def publish_llmapi_repository(
    resolved: Any, artifact_dir: Path, artifact_digest: str, out_dir: Path, *, repository_key: str | None = None,
) -> Path:
    """Write the llmapi repository for the LLM-API artifact `artifact_dir` into `out_dir` (absent or empty) and
    validate it; returns `out_dir`.

    `resolved` is a `trtpipe.resolve.ResolvedSpec` (its target says GPU or cpu-reference, its triton section
    streaming or not, its toolchain the serving container); `artifact_digest` the artifact's store digest, written
    into config.pbtxt as trtpipe_engine_digest with `repository_key` as trtpipe_repository_key. Raises a
    TrtpipeError naming the file, field and fix when the artifact is incomplete or the result does not validate.
    """
    from trtpipe.serving.validate import validate_repository

    artifact_dir = Path(artifact_dir)
    out_dir = Path(out_dir)
    files = check_artifact(artifact_dir)
    llm_args = read_llm_args(artifact_dir)
    def write(staging: Path, identity_values: dict[str, str]) -> dict[str, Any]:
        _write(resolved, artifact_dir, files, llm_args, staging, identity_values)
        return build_manifest(resolved, artifact_dir, artifact_digest, files, llm_args, repository_key)

    return write_repository_atomically(out_dir, artifact_digest, repository_key, write,
                                       lambda staging: validate_repository(staging, configs=resolved.configs),
                                       "llmapi repository")


def served_tokenizer(repo: Path, option: str) -> tuple[Path, bool]:
    """The tokenizer.json the llmapi model's LLM loads (its checkpoint folder, model.yaml `model`), with the LLM
    API's default add_special_tokens=True. `option` names where the repository came from, for the error."""
    config = Path(repo) / VERSION_DIR / MODEL_YAML
    try:
        settings = yaml.safe_load(config.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as err:
        raise UsageError(f"{option}: cannot read {config}: {' '.join(str(err).split())[:160]}",
                         fix="pass a model repository published by trtpipe, or the tokenizer directory itself") from None
    model = str(settings.get("model") or "") if isinstance(settings, dict) else ""
    # GPU repositories name the container's mount; the files are the repository's own checkpoint folder.
    version_dir = Path(repo) / VERSION_DIR
    folder = version_dir / Path(model).name if model else version_dir / ARTIFACT_SUBDIR
    tokenizer_json = folder / SERVING_TOKENIZER_FILE
    if not folder.resolve().is_relative_to(version_dir.resolve()) or not tokenizer_json.is_file():
        raise UsageError(f"{option}: {tokenizer_json} does not exist (the llmapi model's tokenizer)",
                         fix="publish the repository again")
    return tokenizer_json, True
