"""Engine validation: an engine directory is checked against its plan before it may be stored.

Checks: config.json `version` is the toolchain's TRT-LLM version; `build_config` limits and
`plugin_config` equal the plan's; the checkpoint mapping equals tp/pp; there is one rank file per
rank (rank{N}.engine, or rank{N}.safetensors for a reference engine). The TensorRT version and GPU
SM the engine is bound to are recorded for the manifest. Any mismatch raises EngineValidationError.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from trtpipe.errors import TrtpipeError

HARD_LIMITS = ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens", "max_beam_width")


class EngineValidationError(TrtpipeError):
    """The engine does not match its plan; it must not be stored."""

    def __init__(self, engine_dir: Path, problems: list[str]) -> None:
        self.problems = problems
        super().__init__(
            f"engine {engine_dir} failed validation: {'; '.join(problems)}",
            fix="rebuild the engine stage; an engine that does not match its plan is never stored",
        )


class EngineValidation(BaseModel):
    """What the manifest records about a validated engine."""

    trtllm_version: str
    tensorrt_version: str | None
    gpu_sm: int | None
    gpu_product: str | None
    world_size: int
    tp: int
    pp: int
    rank_files: list[str]
    reference: bool


def _release(version: str) -> str:
    return re.split(r"[+]|\.post|rc|\.dev", str(version))[0].rstrip(".")


def _plugin_matches(planned: Any, built: Any, dtype: str) -> bool:
    if isinstance(planned, bool):
        if isinstance(built, str):
            return (built == "enable") == planned
        return bool(built) == planned
    if planned is None:
        return built in (None, "disable", False)
    if planned == "auto":
        return built in ("auto", dtype)
    return built == planned


def validate_engine(engine_dir: Path, plan: Any, *, tensorrt_version: str | None = None,
                    gpu_sm: int | None = None) -> EngineValidation:
    """Check an engine directory against its plan; EngineValidationError lists every mismatch."""
    engine_dir = Path(engine_dir)
    problems: list[str] = []
    config_path = engine_dir / "config.json"
    if not config_path.is_file():
        raise EngineValidationError(engine_dir, ["config.json is missing"])
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise EngineValidationError(engine_dir, [f"config.json is not valid JSON ({exc})"]) from None

    reference = bool(config.get("trtpipe_reference"))
    if reference != plan.is_reference:
        problems.append(
            f"engine is {'a reference' if reference else 'a TensorRT'} engine but the plan targets "
            f"{'cpu-reference' if plan.is_reference else plan.target_gpu}"
        )
    version = str(config.get("version", ""))
    if _release(version) != _release(plan.trtllm_version):
        problems.append(f"config.json version {version or '(none)'} != toolchain TensorRT-LLM {plan.trtllm_version}")

    build = config.get("build_config") or {}
    for key in HARD_LIMITS:
        if build.get(key) != plan.limits[key]:
            problems.append(f"build_config.{key} {build.get(key)} != plan {plan.limits[key]}")
    if build.get("opt_num_tokens") is not None and build.get("opt_num_tokens") != plan.limits["opt_num_tokens"]:
        problems.append(f"build_config.opt_num_tokens {build.get('opt_num_tokens')} != plan {plan.limits['opt_num_tokens']}")
    built_plugins = build.get("plugin_config") or {}
    kv_type = str(build.get("kv_cache_type", "")).lower()
    if "paged" not in kv_type and built_plugins.get("paged_kv_cache") is not True:
        problems.append(f"KV cache is not paged (kv_cache_type {build.get('kv_cache_type')!r})")
    for key, planned in plan.plugin_config.items():
        if key not in built_plugins:
            problems.append(f"plugin_config.{key} is missing (plan: {planned})")
        elif not _plugin_matches(planned, built_plugins[key], plan.dtype):
            problems.append(f"plugin_config.{key} {built_plugins[key]!r} != plan {planned!r}")

    mapping = (config.get("pretrained_config") or {}).get("mapping") or {}
    tp = int(mapping.get("tp_size", 1))
    pp = int(mapping.get("pp_size", 1))
    world = int(mapping.get("world_size") or tp * pp)
    if (tp, pp) != (plan.tp, plan.pp) or world != plan.world_size:
        problems.append(f"mapping tp={tp} pp={pp} world_size={world} != plan tp={plan.tp} pp={plan.pp}")

    suffix = "safetensors" if reference else "engine"
    expected = {f"rank{rank}.{suffix}" for rank in range(plan.world_size)}
    present = {p.name for p in engine_dir.glob(f"rank*.{suffix}")}
    if present != expected:
        missing = sorted(expected - present)
        extra = sorted(present - expected)
        detail = ", ".join(
            part for part in (f"missing {', '.join(missing)}" if missing else "",
                              f"unexpected {', '.join(extra)}" if extra else "") if part
        )
        problems.append(f"{len(present)} rank{{N}}.{suffix} file(s) for world size {plan.world_size} ({detail})")
    else:
        empty = sorted(name for name in present if (engine_dir / name).stat().st_size == 0)
        if empty:
            problems.append(f"empty engine file(s): {', '.join(empty)}")

    if problems:
        raise EngineValidationError(engine_dir, problems)
    return EngineValidation(
        trtllm_version=version,
        tensorrt_version=None if reference else (tensorrt_version or plan.tensorrt_version),
        gpu_sm=None if reference else (gpu_sm or plan.gpu_sm),
        gpu_product=plan.gpu_product,
        world_size=plan.world_size,
        tp=plan.tp,
        pp=plan.pp,
        rank_files=sorted(present),
        reference=reference,
    )
