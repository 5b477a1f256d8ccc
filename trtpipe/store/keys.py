"""Stage keys: the exact inputs that determine a stage's output, hashed.

A key is the sha256 of the canonical JSON of a small document that names the key schema, the
stage kind and every input the stage output depends on. Two builds share a key exactly when
they would produce the same artifact. No path, time or host name ever enters a key: files enter
by their content digest only.

Dependency chain (which keys change when an input changes):
    checkpoint  <- HF weight + config digests, dtype, quant recipe, tp, pp, ModelOpt + transformers versions
    engine      <- checkpoint key + full build config + TRT-LLM + TensorRT versions + target SM + GPU product
    repository  <- engine DIGEST + serving options + tokenizer digest + serving templates digest + trtpipe
                   version + the artifact's name, target and release gates
The repository key hashes the engine's digest, not its key: a published repository is a function of
the engine's bytes, so a rebuilt engine with other bytes publishes a new repository, and one with the
same bytes reuses it. Name and gates are part of what a repository is (promote reads them from it), so
two specs that differ only there get two repositories.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

# Bump when the meaning of a key document changes: every old entry then simply misses.
KEY_SCHEMA = 2

# Quantization algorithms that need calibration data (weight-only INT8 and "none" do not).
_CALIBRATED_ALGOS = frozenset({"fp8", "int4_awq", "w4a8_awq", "int8_sq", "nvfp4"})
# KV-cache dtypes whose scales come from calibration.
_CALIBRATED_KV = frozenset({"fp8", "int8"})
# Algorithms where the AWQ group size shapes the output.
_GROUPED_ALGOS = frozenset({"int4_awq", "w4a8_awq"})


class StageKey(BaseModel):
    """A stage key and the document that was hashed to make it (stored in the entry manifest)."""

    model_config = ConfigDict(frozen=True)

    kind: str
    key: str
    inputs: dict[str, Any]

    def __str__(self) -> str:
        return self.key


def _check_json(value: Any, where: str = "$") -> None:
    """Refuse values whose JSON form is not canonical (floats that are not finite, odd types)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where}: non-finite float {value!r} cannot enter a key")
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, str):
                raise ValueError(f"{where}: key {k!r} is not a string")
            _check_json(v, f"{where}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_json(v, f"{where}[{i}]")
    elif not isinstance(value, (str, int, float, bool)) and value is not None:
        raise ValueError(f"{where}: {type(value).__name__} cannot enter a key; convert it to JSON first")


def canonical_json(value: Any) -> bytes:
    """Deterministic JSON bytes: sorted keys, no whitespace, UTF-8."""
    _check_json(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def hash_document(document: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical_json(document)).hexdigest()


def _make(kind: str, inputs: dict[str, Any]) -> StageKey:
    document = {"key_schema": KEY_SCHEMA, "kind": kind, **inputs}
    return StageKey(kind=kind, key=hash_document(document), inputs=document)


def needs_calibration(algo: str, kv_cache: str) -> bool:
    return algo in _CALIBRATED_ALGOS or kv_cache in _CALIBRATED_KV


def checkpoint_key(
    *,
    config_digest: str,
    weight_digests: Iterable[str] | None,
    dtype: str,
    algo: str,
    kv_cache: str,
    group_size: int,
    calibration_digest: str | None,
    calibration_samples: int,
    calibration_max_seq_len: int,
    calibration_seed: int,
    calibration_text_field: str = "text",
    tp: int,
    pp: int,
    modelopt_version: str,
    transformers_version: str,
    hf_source: Mapping[str, str] | None = None,
) -> StageKey:
    """Key of a TRT-LLM checkpoint.

    `weight_digests`: sha256 of each HF weight file (order does not matter). When the weights
    are not local, `hf_source` = {"repo_id", "revision"} (a pinned commit is content-addressed).
    Calibration enters only when the recipe uses it; group size only for AWQ algorithms.
    """
    if weight_digests is None and not hf_source:
        raise ValueError("checkpoint_key needs weight digests or a pinned hf_source")
    quant: dict[str, Any] = {"algo": algo, "kv_cache": kv_cache}
    if algo in _GROUPED_ALGOS:
        quant["group_size"] = int(group_size)
    if needs_calibration(algo, kv_cache):
        if calibration_digest is None:
            raise ValueError(f"quantization {algo}/{kv_cache} needs calibration data, but no digest was given")
        quant["calibration"] = {
            "digest": calibration_digest,
            "samples": int(calibration_samples),
            "max_seq_len": int(calibration_max_seq_len),
            "seed": int(calibration_seed),
            "text_field": calibration_text_field,
        }
    return _make(
        "checkpoint",
        {
            "model": {
                "config": config_digest,
                "weights": sorted(weight_digests) if weight_digests is not None else None,
                "hf_source": dict(hf_source) if hf_source else None,
            },
            "dtype": dtype,
            "quant": quant,
            "tp": int(tp),
            "pp": int(pp),
            "modelopt_version": modelopt_version,
            "transformers_version": transformers_version,
        },
    )


def engine_key(
    *,
    checkpoint: str,
    build_config: Mapping[str, Any],
    trtllm_version: str,
    tensorrt_version: str,
    gpu_sm: int | None,
    gpu_product: str,
    plugin_config: Mapping[str, Any] | None = None,
) -> StageKey:
    """Key of an engine: its checkpoint key plus everything trtllm-build is told and runs with."""
    return _make(
        "engine",
        {
            "checkpoint": checkpoint,
            "build_config": dict(build_config),
            "plugin_config": dict(plugin_config) if plugin_config is not None else None,
            "trtllm_version": trtllm_version,
            "tensorrt_version": tensorrt_version,
            "gpu": {"sm": gpu_sm, "product": gpu_product},
        },
    )


def repository_key(
    *,
    engine_digest: str,
    serving: Mapping[str, Any],
    tokenizer_digest: str | None,
    templates_digest: str,
    trtpipe_version: str,
    name: str,
    target: Mapping[str, Any],
    toolchain: str,
    quant: str,
    release: Mapping[str, Any],
) -> StageKey:
    """Key of a Triton model repository: the engine's digest + serving options + tokenizer + writer
    version + what the artifact is released as (name, target, toolchain, quant, release gates).

    `templates_digest` covers the config.pbtxt templates and model.py files the repository is
    rendered from (`trtpipe.serving.templates.templates_digest()`): editing one republishes even
    when the trtpipe version string did not move.
    """
    if not engine_digest.startswith("sha256:"):
        raise ValueError(f"engine_digest {engine_digest!r} is not an artifact digest (sha256:...)")
    return _make(
        "repository",
        {
            "engine": {"digest": engine_digest},
            "serving": dict(serving),
            "tokenizer": tokenizer_digest,
            "templates": templates_digest,
            "trtpipe_version": trtpipe_version,
            "name": name,
            "target": dict(target),
            "toolchain": toolchain,
            "quant": quant,
            "release": dict(release),
        },
    )


def tree_digest(file_digests: Mapping[str, str]) -> str:
    """One digest for a set of files given as {relative name: sha256} (e.g. a tokenizer directory)."""
    return hash_document({"files": dict(sorted(file_digests.items()))})
