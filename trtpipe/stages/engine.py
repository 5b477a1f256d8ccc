"""The engine stage: TRT-LLM checkpoint -> engine, keyed by the checkpoint and everything the build is told.

Key document (`engine_key`): the checkpoint's key, the complete build configuration (limits and every
plugin/feature setting, as the pinned trtllm-build ends with them), the TensorRT-LLM and TensorRT
versions, and the target GPU's SM and product. The `trtllm-build` backend runs the pinned trtllm-build
(local or in its container); the reference backend writes an engine-shaped directory around the
checkpoint for the CPU runtime.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trtpipe.errors import TrtpipeError
from trtpipe.stages.base import InputRef, NoKey, Preview, StageContext
from trtpipe.store.keys import StageKey, make_key

# An engine's weights: one rank file per GPU, a TensorRT engine (trtllm-build) or the reference runtime's
# safetensors (the reference backend wraps the checkpoint as its engine).
ENGINE_WEIGHT_FILES = r"rank[0-9]{1,5}\.(?:engine|safetensors)"


def engine_key(
    *,
    checkpoint: str,
    build_config: Mapping[str, Any],
    trtllm_version: str,
    tensorrt_version: str | None,
    gpu_sm: int | None,
    gpu_product: str,
    plugin_config: Mapping[str, Any] | None = None,
) -> StageKey:
    """Key of an engine: its checkpoint key plus everything trtllm-build is told and runs with."""
    return make_key("engine", {
        "checkpoint": checkpoint,
        "build_config": dict(build_config),
        "plugin_config": dict(plugin_config) if plugin_config is not None else None,
        "trtllm_version": trtllm_version,
        "tensorrt_version": tensorrt_version,
        "gpu": {"sm": gpu_sm, "product": gpu_product},
    })


class EngineStage:
    """Build the engine of the build plan on the checkpoint (`renders_command`: a real trtllm-build, whose
    exact command and container a dry run shows)."""

    name = "engine"
    kind = "engine"
    inputs = ("checkpoint",)
    weight_files = ENGINE_WEIGHT_FILES

    def __init__(self, *, renders_command: bool) -> None:
        self.renders_command = renders_command

    def key(self, ctx: StageContext, inputs: dict[str, InputRef]) -> StageKey:
        checkpoint = inputs["checkpoint"].key
        if checkpoint is None:
            raise NoKey("key needs the checkpoint's weights")
        resolved = ctx.resolved
        return engine_key(
            checkpoint=checkpoint,
            build_config=ctx.build_plan.build_config,
            trtllm_version=resolved.toolchain.trtllm_version,
            tensorrt_version=resolved.toolchain.tensorrt_version,
            gpu_sm=resolved.sm,
            gpu_product=resolved.gpu.product if resolved.gpu else resolved.spec.target.gpu,
        )

    def build(self, ctx: StageContext, out_dir: Path, inputs: dict[str, InputRef], key: StageKey) -> dict[str, Any]:
        from trtpipe.engine.stage import build_engine  # the executors load only when the engine builds

        log_path = ctx.log_path("engine", key.key)
        result = build_engine(ctx.resolved, ctx.build_plan, inputs["checkpoint"].path, out_dir, log_path)
        return {"build_log": str(log_path), "engine_result": result.model_dump(mode="json")}

    def preview(self, ctx: StageContext, key: str | None, inputs: dict[str, InputRef]) -> Preview | None:
        if not self.renders_command:
            return None  # the reference executor runs no trtllm-build and no container
        from trtpipe.engine.executors.docker import container_spec
        checkpoint_dir, out_dir = inputs["checkpoint"].path, ctx.temp_dir("engine", key)
        command = [str(a) for a in ctx.build_plan.render_command(checkpoint_dir, out_dir)]
        preview = Preview(command=command, notes=["command: " + " ".join(command)])
        if ctx.resolved.spec.target.executor.value in ("docker", "auto"):
            try:
                spec = container_spec(ctx.build_plan, ctx.resolved.toolchain, checkpoint_dir, out_dir)
            except TrtpipeError as err:  # a dry run says why there is no container instead of failing
                preview.container = {"unavailable": err.one_line()}
            else:
                preview.container = spec.model_dump(mode="json")
                # The full spec is in --json; a person reads the equivalent docker run line.
                preview.notes.append("container: " + " ".join(str(a) for a in spec.docker_run))
        return preview
