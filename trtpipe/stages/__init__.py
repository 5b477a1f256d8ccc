"""Declared stages, per backend: what the runner (trtpipe.pipeline) builds for a spec, in order.

A stage module imports what keys it at the top and its implementation (converters, executors, the
repository writer) inside `build` and `preview`: the one place imports are deferred, so a warm build
(every stage a hit) loads no converter, executor or writer, let alone torch, transformers or ModelOpt.

resolve and plan are plain steps of the runner; the stored stages come from the spec's backend, built here
from the facts its toolchain class declares (trtpipe.toolchain.BackendFacts): the stages that make its
`artifact` (a TensorRT-LLM checkpoint and its engine, converted in the executor and built by the pinned
trtllm-build on a GPU target, in this process on cpu-reference; or ModelOpt's Hugging Face export), then the
publish stage of its `layout`. A backend that builds one of these artifacts is registered on the toolchain
alone; a new kind of artifact is one more branch in `backend_stages`, with its stage module.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtpipe.engine.plan import make_build_plan
from trtpipe.resolve import ResolvedSpec
from trtpipe.serving.layouts import LAYOUTS
from trtpipe.stages.base import InputRef, NoKey, Preview, StageContext, StoredStage
from trtpipe.stages.checkpoint import CheckpointStage
from trtpipe.stages.engine import EngineStage
from trtpipe.stages.hf_checkpoint import HfCheckpointStage
from trtpipe.stages.imported_engine import ImportedEngineStage
from trtpipe.stages.publish import PublishStage
from trtpipe.store.manifest import WeightFiles
from trtpipe.toolchain import BACKEND_KINDS, backend_facts


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


def backend_stages(kind: str) -> BackendStages:
    """The stages of the backend `kind`, from its facts (see the module doc)."""
    facts = backend_facts(kind)
    layout = LAYOUTS[facts.layout]
    if facts.artifact == "hf-export":
        # ModelOpt's unified HF export + llm_args.json (in the executor on a GPU target, in-process on
        # cpu-reference), then the repository; no engine is built.
        return BackendStages(plan=_llm_api_plan, stages=(HfCheckpointStage(), PublishStage(layout, reads="export")))
    # A TensorRT-LLM checkpoint and its engine. On a GPU target: converted where the engine is built (the
    # executor), by the pinned trtllm-build, whose command a dry run shows; an engine built outside trtpipe can
    # be imported instead. On cpu-reference: converted here, the checkpoint wrapped as the reference runtime's
    # engine, behind the same repository contract.
    on_gpu = facts.runs_on == "gpu"
    publish = PublishStage(layout, reads="engine")
    return BackendStages(
        plan=make_build_plan,
        stages=(CheckpointStage(in_executor=on_gpu), EngineStage(renders_command=on_gpu), publish),
        imported=(lambda engine_dir: imported_engine_stages(engine_dir, publish)) if on_gpu else None,
    )


def imported_engine_stages(engine_dir: Path, publish: PublishStage) -> BackendStages:
    """A GPU engine backend's stages for an engine built outside trtpipe (`trtpipe publish SPEC --engine DIR`): the
    engine is imported instead of converted and built, then published (`publish`) as a built one is."""
    return BackendStages(plan=make_build_plan, stages=(ImportedEngineStage(engine_dir), publish))


BACKEND_STAGES: dict[str, BackendStages] = {kind: backend_stages(kind) for kind in BACKEND_KINDS}


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
