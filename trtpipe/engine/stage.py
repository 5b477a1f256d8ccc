"""The engine stage: pick the executor for a resolved spec, build, validate.

cpu-reference -> reference; otherwise `target.executor` (auto = local when TensorRT-LLM is
installed here, else docker). trtllm-build gets `backend.build_timeout` seconds on either executor (the
spec's field; default 4 h). The engine is validated against the plan before it is returned; the
caller (the store's `building(...)` block) commits only what comes back from here.
"""

from __future__ import annotations

import time
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from trtpipe import model_semantics
from trtpipe.engine.executors.base import ExecutorResult
from trtpipe.engine.executors.docker import DockerExecutor, connect
from trtpipe.engine.executors.local import LocalExecutor
from trtpipe.engine.executors.reference import ReferenceExecutor
from trtpipe.engine.plan import BuildPlan
from trtpipe.engine.validate import EngineValidation, validate_engine
from trtpipe.errors import MissingCapability


class EngineResult(BaseModel):
    engine_dir: Path
    executor: str
    log_path: Path
    duration_s: float
    command: list[str]
    image: str | None
    validation: EngineValidation


def choose_executor_name(resolved: Any) -> str:
    """reference | local | docker for this spec and host (no side effects, no heavy imports)."""
    spec = resolved.spec
    if spec.target.is_cpu_reference:
        return "reference"
    chosen = spec.target.executor.value
    assert chosen != "reference", "trtpipe.resolve refuses the reference executor for a GPU target"
    if chosen == "auto":
        return "local" if find_spec("tensorrt_llm") is not None else "docker"
    return chosen


def make_executor(resolved: Any, plan: BuildPlan, *, gpus: int | list[str] | None = None) -> Any:
    """The executor that builds `plan`, with the spec's `backend.build_timeout`."""
    name = choose_executor_name(resolved)
    if name == "reference":
        return ReferenceExecutor(resolved.spec, token_vocab_size=model_semantics.token_vocab_size(resolved.model_config))
    timeout_s = resolved.spec.backend.build_timeout
    if name == "local":
        return LocalExecutor(resolved.toolchain, target_sm=plan.gpu_sm, timeout_s=timeout_s)
    return DockerExecutor(resolved.toolchain, gpus=gpus, timeout_s=timeout_s, configs=resolved.configs)


def preflight(resolved: Any, plan: BuildPlan) -> str:
    """Check, in well under a second, that the chosen executor can run on this host; return its name.

    Raises MissingCapability (one line naming everything missing) for local without TensorRT-LLM /
    TensorRT / a GPU of the target SM, or docker without a daemon. Call it before the checkpoint
    stage so a host that cannot build the engine fails before hours of conversion.
    """
    name = choose_executor_name(resolved)
    if name == "local":
        LocalExecutor(resolved.toolchain, target_sm=plan.gpu_sm).preflight()
    elif name == "docker":
        if not resolved.toolchain.triton_container:
            raise MissingCapability(
                f"docker executor: toolchain {resolved.toolchain.name} pins no triton_container",
                fix="add the NGC image to build_configs/toolchains.yaml or use target.executor: local",
            )
        connect()
    return name


def build_engine(resolved: Any, plan: BuildPlan, checkpoint_dir: Path, out_dir: Path, log_path: Path,
                 *, executor: Any = None) -> EngineResult:
    """Build the engine for `plan` into out_dir (created by the caller or here) and validate it."""
    started = time.monotonic()
    executor = executor or make_executor(resolved, plan)
    result: ExecutorResult = executor.run(plan, Path(checkpoint_dir), Path(out_dir), Path(log_path))
    validation = validate_engine(Path(out_dir), plan, tensorrt_version=result.tensorrt_version, gpu_sm=result.gpu_sm)
    return EngineResult(
        engine_dir=Path(out_dir),
        executor=result.executor,
        log_path=Path(log_path),
        duration_s=time.monotonic() - started,
        command=result.command,
        image=result.image,
        validation=validation,
    )
