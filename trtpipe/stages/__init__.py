"""Declared stages, per backend: what the runner (trtpipe.pipeline) builds for a spec, in order.

A stage module imports what keys it at the top and its implementation (converters, executors, the
repository writer) inside `build` and `preview`: the one place imports are deferred, so a warm build
(every stage a hit) loads no converter, executor or writer, let alone torch, transformers or ModelOpt.

resolve and plan are plain steps of the runner; the stored stages come from the spec's backend. Adding a
backend is one entry here with its stages (its artifact stage, its repository writer's publish stage),
next to its variant on the toolchain (trtpipe.toolchain.Backend) and its contract tables.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtpipe.engine.plan import make_build_plan
from trtpipe.resolve import ResolvedSpec
from trtpipe.serving.layouts import INFLIGHT_BATCHER_LLM, LAYOUTS, LLMAPI
from trtpipe.stages.base import InputRef, NoKey, Preview, StageContext, StoredStage
from trtpipe.stages.checkpoint import CheckpointStage
from trtpipe.stages.engine import EngineStage
from trtpipe.stages.hf_checkpoint import HfCheckpointStage
from trtpipe.stages.imported_engine import ImportedEngineStage
from trtpipe.stages.publish import PublishStage
from trtpipe.store.manifest import WeightFiles


@dataclass(frozen=True)
class BackendStages:
    """How one backend builds: its build plan and its stored stages, each after the stages it builds on."""

    plan: Callable[[ResolvedSpec], Any]
    stages: tuple[StoredStage, ...]
    # Its stages for an engine built outside trtpipe (`publish SPEC --engine DIR`), when it serves engines.
    imported: Callable[[Path], BackendStages] | None = None


def _llm_api_plan(resolved: ResolvedSpec) -> Any:
    """The LLM() arguments resolve derived (trtpipe.llm_api.derive.LlmApiPlan): the llm-api build plan."""
    assert resolved.llm_api is not None, "resolve derives the LLM() arguments for backend llm-api"
    return resolved.llm_api


def _publish_engine() -> PublishStage:
    """The trtllm-build and reference backends publish their engine in upstream's inflight_batcher_llm layout."""
    return PublishStage(LAYOUTS[INFLIGHT_BATCHER_LLM], reads="engine")


BACKEND_STAGES: dict[str, BackendStages] = {
    # The GPU path: convert where the engine is built (the executor), run the pinned trtllm-build.
    "trtllm-build": BackendStages(
        plan=make_build_plan,
        stages=(CheckpointStage(in_executor=True), EngineStage(renders_command=True), _publish_engine()),
        imported=lambda engine_dir: imported_engine_stages(engine_dir),
    ),
    # The CPU reference: convert here, wrap the checkpoint as the runtime's engine, same repository contract.
    "reference": BackendStages(
        plan=make_build_plan,
        stages=(CheckpointStage(in_executor=False), EngineStage(renders_command=False), _publish_engine()),
    ),
    # TensorRT-LLM's PyTorch backend: ModelOpt's unified HF export + llm_args.json (in the executor on a GPU
    # target, in-process on cpu-reference), then the llmapi repository; no engine is built.
    "llm-api": BackendStages(
        plan=_llm_api_plan,
        stages=(HfCheckpointStage(), PublishStage(LAYOUTS[LLMAPI], reads="export")),
    ),
}



def imported_engine_stages(engine_dir: Path) -> BackendStages:
    """The trtllm-build backend's stages for an engine built outside trtpipe (`trtpipe publish SPEC --engine DIR`):
    the engine is imported instead of converted and built, then published as a built one is."""
    return BackendStages(plan=make_build_plan, stages=(ImportedEngineStage(engine_dir), _publish_engine()))


def weight_file_rule() -> WeightFiles:
    """Which files of each artifact kind hold weights, as every stage that stores the kind declares them (the
    publish stage: its layout's). A remote cache checks each pulled file's declared size against it."""
    declared: defaultdict[str, list[str]] = defaultdict(list)
    stages = [stage for backend in BACKEND_STAGES.values() for stage in backend.stages]
    for stage in [*stages, ImportedEngineStage]:
        declared[stage.kind].append(stage.weight_files)
    return WeightFiles.of(declared)


# Every stored stage's name (what `--force` takes), in build order.
STORED_STAGE_NAMES = tuple(dict.fromkeys(s.name for b in BACKEND_STAGES.values() for s in b.stages))

__all__ = ["BACKEND_STAGES", "STORED_STAGE_NAMES", "BackendStages", "InputRef", "NoKey", "Preview",
           "StageContext", "StoredStage", "imported_engine_stages", "weight_file_rule"]
