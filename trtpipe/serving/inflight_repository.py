"""Publish a Triton model repository in upstream's inflight_batcher_llm layout for one engine (that layout's
writer; what every layout's writer shares is trtpipe.serving.repository_files).

Layout written into `out_dir`:
    ensemble/config.pbtxt
    preprocessing/{config.pbtxt, 1/model.py, tokenizer/*}
    tensorrt_llm/{config.pbtxt, 1/<engine files>[, 1/model.py for cpu-reference]}
    postprocessing/{config.pbtxt, 1/model.py, tokenizer/*}
    tensorrt_llm_bls/{config.pbtxt, 1/model.py, tokenizer/*}
    trtpipe.json   (manifest: name, release gates, engine key and digest, toolchain, target, serving container)

Every config.pbtxt carries the artifact's identity as parameters (`trtpipe.serving.identity`):
the engine digest and the repository key; `trtpipe serve` adds the repository digest to its
serving copy. The engine files are hard-linked (or reflinked) from the store, never copied unless
both fail (a warning says so). Nothing in the output depends on which of those happened, or on
when or where it was published: the repository's digest is its content's.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from trtpipe import model_semantics
from trtpipe.errors import IntegrityError, InvalidInput, UsageError
from trtpipe.model_folder import SERVING_TOKENIZER_FILE, TOKENIZER_FILES, copy_confined, folder_roots
from trtpipe.serving import identity, templates
from trtpipe.serving.repository_files import (
    CONTAINER_REPO_MOUNT,
    MANIFEST_FORMAT,
    STORE_MANIFEST,
    Placement,
    bool_parameter,
    manifest_header,
    place_file,
    write_repository_atomically,
)
from trtpipe.serving.templates import ENGINE_SUBDIR

log = logging.getLogger(__name__)

TOKENIZER_SUBDIR = "tokenizer"
MODELS_WITH_TOKENIZER = ("preprocessing", "postprocessing", "tensorrt_llm_bls")




class EngineFacts(BaseModel):
    """What publish needs from an engine dir's config.json (real or reference engine)."""

    trtllm_version: str | None
    reference: bool
    max_batch_size: int
    max_input_len: int
    max_seq_len: int
    max_beam_width: int
    tp: int
    pp: int
    # pretrained_config.logits_dtype as trtllm-build records it (None: absent, TensorRT-LLM's default applies).
    logits_dtype: str | None = None
    # pretrained_config.vocab_size: the rows of its embedding and head, padded beyond the tokenizer's ids for INT4-AWQ.
    vocab_size: int | None = None

    @property
    def world_size(self) -> int:
        return self.tp * self.pp


def read_engine_facts(engine_dir: Path) -> EngineFacts:
    config_path = engine_dir / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except FileNotFoundError:
        raise IntegrityError(f"{config_path} not found: not a built engine", path=str(config_path),
                             fix="rebuild the engine") from None
    except json.JSONDecodeError as err:
        raise IntegrityError(f"{config_path}: not valid JSON ({err})", path=str(config_path), fix="rebuild the engine") from None
    build = config.get("build_config") or {}
    pretrained = config.get("pretrained_config") or {}
    mapping = pretrained.get("mapping") or {}
    missing = [k for k in ("max_batch_size", "max_input_len", "max_seq_len") if k not in build]
    if missing:
        raise IntegrityError(
            f"{config_path}: build_config lacks {', '.join(missing)}", path=str(config_path),
            fix="rebuild the engine",
        )
    return EngineFacts(
        trtllm_version=config.get("version"),
        reference=bool(config.get("trtpipe_reference", False)),
        max_batch_size=int(build["max_batch_size"]),
        max_input_len=int(build["max_input_len"]),
        max_seq_len=int(build["max_seq_len"]),
        max_beam_width=int(build.get("max_beam_width", 1)),
        tp=int(mapping.get("tp_size", 1)),
        pp=int(mapping.get("pp_size", 1)),
        logits_dtype=pretrained.get("logits_dtype"),
        vocab_size=int(pretrained["vocab_size"]) if isinstance(pretrained.get("vocab_size"), int) else None,
    )


def engine_vocab(resolved: Any, engine: EngineFacts) -> tuple[int, int]:
    """(the tokenizer's vocabulary, the engine's padded one). The padding ModelOpt and TensorRT-LLM add is below
    64 x tp rows (ModelOpt pads to a multiple of 64 for INT4-AWQ, TRT-LLM to a multiple of tp); more, or fewer rows
    than the model's vocab_size, means the engine is not this model's."""
    tokens = model_semantics.token_vocab_size(resolved.model_config)
    padded = engine.vocab_size if engine.vocab_size is not None else tokens
    if not tokens <= padded < tokens + 64 * engine.tp:
        raise InvalidInput(
            f"the engine's pretrained_config.vocab_size {padded} does not fit the model's vocab_size {tokens} "
            f"(padding goes up to {tokens + 64 * engine.tp - 1} at tp={engine.tp})",
            fix="publish the engine built from this spec's model",
        )
    return tokens, padded


def _bool(value: bool) -> str:
    return "true" if value else "false"


def template_values(resolved: Any, engine: EngineFacts) -> dict[str, str]:
    """Every template variable, filled explicitly from the spec and the engine."""
    spec = resolved.spec
    triton, runtime = spec.backend.triton, spec.runtime  # an engine backend's Triton options
    reference = spec.target.is_cpu_reference
    batch = triton.max_batch_size if triton.max_batch_size is not None else engine.max_batch_size
    if batch > engine.max_batch_size:
        raise InvalidInput(
            f"backend.triton.max_batch_size {batch} exceeds the engine's max_batch_size {engine.max_batch_size}",
            fix=f"set backend.triton.max_batch_size <= {engine.max_batch_size} or rebuild with a larger "
                "limits.max_batch_size",
        )
    logits_datatype = _logits_datatype(engine, resolved.configs)
    if not reference:
        _check_backend_values(runtime, resolved.configs)
    tokens, padded = engine_vocab(resolved, engine)
    return {
        "triton_max_batch_size": str(batch),
        "decoupled_mode": _bool(runtime.streaming),
        "max_queue_delay_microseconds": str(triton.max_queue_delay_microseconds),
        "tensorrt_llm_instance_count": str(triton.tensorrt_llm_instance_count),
        "preprocessing_instance_count": str(triton.preprocessing_instance_count),
        "postprocessing_instance_count": str(triton.postprocessing_instance_count),
        "bls_instance_count": "1",
        "max_beam_width": str(engine.max_beam_width),
        "batching_strategy": "inflight_fused_batching",
        # cpu-reference: relative to the model folder (the repository may move); GPU: the container mount.
        "engine_dir": "1" if reference else f"{CONTAINER_REPO_MOUNT}/{ENGINE_SUBDIR}",
        "batch_scheduler_policy": runtime.scheduler_policy.value,
        "kv_cache_free_gpu_mem_fraction": str(runtime.kv_cache_free_fraction),
        "enable_kv_cache_reuse": _bool(runtime.kv_cache_reuse),
        "enable_chunked_context": _bool(runtime.chunked_prefill),
        "exclude_input_in_output": "true",
        "gpu_device_ids": "" if reference else ",".join(str(i) for i in range(engine.world_size)),
        "tokenizer_dir": TOKENIZER_SUBDIR,
        "add_special_tokens": "true",
        "skip_special_tokens": "true",
        "max_input_len": str(engine.max_input_len),
        # What the model computes and a checkpoint does not carry (trtpipe.model_semantics): its attention window
        # per layer, and the tokenizer's vocabulary against the engine's padded one.
        "max_attention_window_size": model_semantics.window_parameter(resolved.model_config, engine.max_seq_len),
        "vocab_size": str(tokens),
        "padded_vocab_size": str(padded),
        # context_logits / generation_logits are declared with the engine's own logits type: the C++ backend
        # checks the engine's against the declared one on every request that returns logits.
        "logits_datatype": logits_datatype,
        # Read unguarded by the C++ backend (tensorrtllm_parameters.yaml): written empty, which it treats as unset
        # (guided decoding off). Upstream's template leaves the ${...} placeholders, which the backend also takes
        # as unset, but templates.render and validate refuse a leftover placeholder.
        "guided_decoding_backend": "",
        "xgrammar_tokenizer_info_path": "",
    }


def _logits_datatype(engine: EngineFacts, configs: Path) -> str:
    from trtpipe.serving.parameters import load_parameter_table, logits_datatype

    table = load_parameter_table(configs=configs)
    declared = logits_datatype(table, engine.logits_dtype)
    if declared is None:
        raise InvalidInput(
            f"the engine's pretrained_config.logits_dtype is {engine.logits_dtype!r}; the tensorrtllm backend serves "
            f"logits only as {', '.join(table.logits.dtypes)}",
            fix="rebuild the engine with trtllm-build --logits_dtype float16 (or float32)",
        )
    return declared


def _check_backend_values(runtime: Any, configs: Path) -> None:
    """Spec values the C++ backend's executor refuses though the spec allows them (the spec serves both backends)."""
    from trtpipe.serving.parameters import PARAMETER_FILE, load_parameter_table

    row = load_parameter_table(configs=configs).row("kv_cache_free_gpu_mem_fraction")
    fraction = runtime.kv_cache_free_fraction
    if row is not None and row.range is not None and not row.range.holds(fraction):
        raise InvalidInput(
            f"runtime.kv_cache_free_fraction {fraction:g}: the tensorrtllm backend's executor accepts only "
            f"{row.range.text()} (build_configs/{PARAMETER_FILE})",
            fix="set runtime.kv_cache_free_fraction below 1, e.g. 0.95",
        )






def place_engine(engine_dir: Path, dest: Path) -> tuple[Placement, list[str]]:
    placements: set[Placement] = set()
    names: list[str] = []
    for src in sorted(engine_dir.iterdir()):
        if not src.is_file() or src.name == STORE_MANIFEST:
            continue  # the store's own bookkeeping is not part of the engine
        if src.name == "model.py":
            raise IntegrityError(f"{src}: an engine dir must not contain model.py", path=str(src), fix="rebuild the engine")
        placements.add(place_file(src, dest / src.name))
        names.append(src.name)
    if not names:
        raise IntegrityError(f"{engine_dir} holds no engine files", path=str(engine_dir), fix="rebuild the engine")
    # The weakest placement is the one to report.
    for kind in ("copy", "reflink", "hardlink"):
        if kind in placements:
            return kind, names  # type: ignore[return-value]
    raise AssertionError("unreachable")


def copy_tokenizer(tokenizer_dir: Path, dest: Path, *, allow_external_links: bool = False) -> list[str]:
    """Copy the tokenizer files into `dest`. The model folder is a boundary (trtpipe.model_folder): a file that
    resolves outside the folder is refused here too, at the moment it is copied, unless the spec allows it."""
    if not (tokenizer_dir / SERVING_TOKENIZER_FILE).is_file():
        raise InvalidInput(
            f"{tokenizer_dir}: no {SERVING_TOKENIZER_FILE} (the serving models read it with the tokenizers library)",
            fix="point model.tokenizer at a directory with a fast tokenizer (save it with tokenizer.save_pretrained)",
        )
    dest.mkdir(parents=True, exist_ok=True)
    roots = folder_roots(tokenizer_dir)
    copied = []
    for name in TOKENIZER_FILES:
        src = tokenizer_dir / name
        if src.is_file():
            if allow_external_links:
                shutil.copy2(src, dest / name)
            else:
                copy_confined(src, dest / name, roots)
            copied.append(name)
    return copied


def _write_models(
    resolved: Any, engine_dir: Path, values: dict[str, str], root: Path, identity_values: dict[str, str]
) -> tuple[Placement, list[str], list[str]]:
    reference = resolved.spec.target.is_cpu_reference
    sources = templates.REFERENCE_SOURCES if reference else templates.GPU_SOURCES
    template_root = templates.template_root()
    for model, source in sources.items():
        model_dir = root / model
        (model_dir / "1").mkdir(parents=True)
        src_dir = template_root / source
        text = templates.render((src_dir / "config.pbtxt").read_text(), values, source=f"{source}/config.pbtxt")
        text = identity.add_parameters(text, identity_values, where=f"{source}/config.pbtxt")
        (model_dir / "config.pbtxt").write_text(text)
        code = src_dir / "1" / "model.py"
        if code.is_file():
            shutil.copy2(code, model_dir / "1" / "model.py")
    placement, engine_files = place_engine(engine_dir, root / ENGINE_SUBDIR)
    tokenizer_dir = resolved.tokenizer_dir or resolved.model_dir
    if tokenizer_dir is None:
        raise InvalidInput(
            "the spec names no tokenizer and no local model directory",
            fix="set model.tokenizer to a local tokenizer directory",
        )
    first = root / MODELS_WITH_TOKENIZER[0] / TOKENIZER_SUBDIR
    tokenizer_files = copy_tokenizer(Path(tokenizer_dir), first,
                                     allow_external_links=resolved.spec.model.allow_external_links)
    for model in MODELS_WITH_TOKENIZER[1:]:
        other = root / model / TOKENIZER_SUBDIR
        other.mkdir()
        for name in tokenizer_files:
            os.link(first / name, other / name)
    return placement, engine_files, tokenizer_files




def build_manifest(
    resolved: Any,
    engine: EngineFacts,
    engine_digest: str,
    engine_key: str,
    engine_files: list[str],
    tokenizer_files: list[str],
    values: dict[str, str],
    repository_key: str | None = None,
) -> dict[str, Any]:
    spec = resolved.spec
    return {
        "format": MANIFEST_FORMAT,
        **manifest_header(resolved, repository_key),
        "engine": {
            "key": engine_key,
            "digest": engine_digest,
            "trtllm_version": engine.trtllm_version,
            "world_size": engine.world_size,
            "tp": engine.tp,
            "pp": engine.pp,
            "max_batch_size": engine.max_batch_size,
            "max_input_len": engine.max_input_len,
            "max_seq_len": engine.max_seq_len,
            "max_beam_width": engine.max_beam_width,
            "vocab_size": int(values["vocab_size"]),
            "padded_vocab_size": int(values["padded_vocab_size"]),
            "max_attention_window_size": values["max_attention_window_size"],
            "dir": ENGINE_SUBDIR,
            "files": engine_files,
        },
        "streaming": spec.runtime.streaming,
        "triton_max_batch_size": int(values["triton_max_batch_size"]),
        "models": list(templates.MODEL_NAMES),
        "tokenizer_files": tokenizer_files,
    }


def publish_repository(
    resolved: Any, engine_dir: Path, engine_digest: str, engine_key: str, out_dir: Path, *,
    repository_key: str | None = None,
) -> Path:
    """Write the model repository for `engine_dir` into `out_dir` (absent or empty) and validate it.

    `resolved` is a `trtpipe.resolve.ResolvedSpec`; `repository_key` the store key the repository is
    published under (written into every config.pbtxt with the engine digest). Returns `out_dir`.
    Raises a TrtpipeError naming the model, field and fix when the result does not validate.
    """
    from trtpipe.serving.validate import validate_repository

    engine_dir = Path(engine_dir)
    out_dir = Path(out_dir)
    engine = read_engine_facts(engine_dir)
    if engine.reference != resolved.spec.target.is_cpu_reference:
        kind = "a reference engine" if engine.reference else "a TensorRT engine"
        raise InvalidInput(
            f"{engine_dir} is {kind} but the spec targets {resolved.spec.target.gpu}",
            fix="publish the engine built for this spec's target",
        )
    values = template_values(resolved, engine)

    def write(staging: Path, identity_values: dict[str, str]) -> dict[str, Any]:
        _placement, engine_files, tokenizer_files = _write_models(resolved, engine_dir, values, staging, identity_values)
        return build_manifest(
            resolved, engine, engine_digest, engine_key, engine_files, tokenizer_files, values, repository_key
        )

    return write_repository_atomically(out_dir, engine_digest, repository_key, write,
                                       lambda staging: validate_repository(staging, configs=resolved.configs),
                                       "repository")






def served_tokenizer(repo: Path, option: str) -> tuple[Path, bool | None]:
    """The tokenizer.json and add_special_tokens of a published repository's preprocessing model, found the way
    the served preprocessing/1/model.py finds them (its `tokenizer_dir` and `add_special_tokens` parameters).
    `option` names where the repository came from, for the error."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    config_path = repo / "preprocessing" / "config.pbtxt"
    config = mc.ModelConfig()
    try:
        text_format.Parse(config_path.read_text(encoding="utf-8"), config)
    except (OSError, text_format.ParseError) as err:
        raise UsageError(
            f"{option}: cannot read {config_path}: {' '.join(str(err).split())[:160]}",
            fix="pass a model repository published by trtpipe, or the tokenizer directory itself",
        ) from None
    params = {key: value.string_value for key, value in config.parameters.items()}
    tokenizer_dir = (repo / "preprocessing" / (params.get("tokenizer_dir") or TOKENIZER_SUBDIR)).resolve()
    if not tokenizer_dir.is_relative_to((repo / "preprocessing").resolve()):
        raise UsageError(
            f"{config_path}: parameter tokenizer_dir {params['tokenizer_dir']!r} leaves the model directory",
            fix="publish the repository again",
        )
    tokenizer_json = tokenizer_dir / SERVING_TOKENIZER_FILE
    if not tokenizer_json.is_file():
        raise UsageError(
            f"{option}: {tokenizer_json} does not exist (the preprocessing model's tokenizer)",
            fix="publish the repository again",
        )
    return tokenizer_json, bool_parameter(params.get("add_special_tokens"))
