"""Checkpoint conversion where the engine is built.

For a GPU target the checkpoint stage does not convert on the host that runs trtpipe (a 70B FP8
calibration on a CI runner's CPU is impossible in practice): it hands the conversion to the engine's
executor, which runs `trtpipe.engine.convert_entry` on the GPU builder, in its TensorRT-LLM
environment (local) or in the toolchain's pinned container (docker), with GPU calibration. The host
only plans, checks and stores. cpu-reference targets keep converting in-process.

The key does not change with where the conversion runs: the checkpoint key
(trtpipe.stages.checkpoint.checkpoint_key) covers the weights, config, recipe, calibration data, tp/pp and the
toolchain's ModelOpt and transformers pins, never the executor. So the executor must convert with
exactly those pins:
- local: the installed nvidia-modelopt and transformers must match them (checked from package metadata
  before anything starts, LocalExecutor.missing_converter_packages);
- docker: the container gets ModelOpt and transformers from pip installing the TensorRT-LLM wheel with
  its own requirements (triton-inference-server/tensorrtllm_backend, dockerfile/Dockerfile.triton.trt_llm_backend:
  branch r25.08 @0862e6fb line 246 installs the wheel built from TRT-LLM release/0.21; r25.10 @e2e72dc8
  line 188 `tensorrt_llm==1.0.0`; r25.12 @5419275f line 181 `tensorrt_llm==1.1.0`; r26.04 @ce68ff5f
  line 163 `tensorrt_llm==1.2.1`, into /opt/venv-tritonserver, first on PATH from line 121). The
  toolchain table's modelopt_version / transformers_version are those requirements (each cited in
  build_configs/toolchains.yaml), so the container carries the key's pins. trtpipe.resolve refuses a
  toolchain without both pins (the key could not name what the container converts with), or whose pins
  trtpipe's converter is not written for (trtpipe.quant.CONVERTER_MODELOPT: trtllm-0.21.0 and trtllm-1.0.0);
  convert_checkpoint checks the installed versions again inside, before it loads the model.

The conversion gets `backend.conversion_timeout` seconds on either executor (the spec's field; default 4 h).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from trtpipe.checkpoint.calibration import calibration_source
from trtpipe.checkpoint.convert import ConvertSummary
from trtpipe.checkpoint.hf_export import HfExportSummary, validate_hf_artifact
from trtpipe.checkpoint.schema import validate_checkpoint
from trtpipe.engine.executors.base import BuildFailed, ConversionJob, ExecutorResult
from trtpipe.engine.executors.docker import DockerExecutor, conversion_container_spec
from trtpipe.engine.executors.local import LocalExecutor
from trtpipe.engine.plan import BuildPlan, make_build_plan
from trtpipe.engine.stage import choose_executor_name, preflight
from trtpipe.errors import InvalidInput, TrtpipeError

# The distributions whose modules a conversion imports, and how the toolchain's container has them.
# (A test runs a real conversion and checks that every third-party module it imports belongs to the
# dependency closure of these.) "requirements" = TensorRT-LLM's requirements.txt on the 1.2 line
# (NVIDIA/TensorRT-LLM @000867d9): accelerate>=1.7.0, nvidia-modelopt[torch]~=0.37.0, pydantic>=2.9.1,
# transformers; torch is NVIDIA's build copied from the PyTorch image (Dockerfile r26.04 lines 110-111).
CONTAINER_PACKAGES = {
    "torch": "the NGC PyTorch build copied into the image (Dockerfile r26.04 lines 110-111)",
    "nvidia-modelopt": "TensorRT-LLM requirement nvidia-modelopt[torch]~=0.37.0",
    "transformers": "TensorRT-LLM requirement (pinned; toolchains.yaml transformers_version)",
    "accelerate": "TensorRT-LLM requirement accelerate>=1.7.0",
    "pydantic": "TensorRT-LLM requirement pydantic>=2.9.1 (and nvidia-modelopt's pydantic>=2.0)",
    "rich": "nvidia-modelopt 0.37.0 requirement",
    "pyyaml": "transformers 4.57.3 requirement pyyaml>=5.1",
    "safetensors": "transformers 4.57.3 requirement safetensors>=0.4.3",
    "tokenizers": "transformers 4.57.3 requirement tokenizers>=0.22.0,<=0.23.0",
}

JOB_SUFFIX = "-job"
MODEL_PLACEHOLDER = "<model.path>"


class ConversionPreview(BaseModel):
    """What a dry run shows of the conversion: where it runs and exactly what runs there."""

    executor: str
    where: str
    command: list[str]
    container: dict[str, Any] | None = None


# ------------------------------------------------------------------------------------------------ the job


def _symlink_target_dirs(root: Path) -> list[Path]:
    """Folders outside `root` that symlinks under it point into (a Hugging Face cache snapshot links
    every file to ../../blobs/<sha>): mounted too, at their real paths, so the links resolve."""
    real_root = root.resolve()
    found: set[Path] = set()
    for folder, dirs, files in os.walk(real_root):
        for name in [*files, *dirs]:
            path = Path(folder) / name
            if not path.is_symlink():
                continue
            target = path.resolve()
            if target != real_root and real_root not in target.parents:
                found.add(target if target.is_dir() else target.parent)
    # Keep the outermost folders only.
    return sorted(p for p in found if not any(q in p.parents for q in found))


def conversion_inputs(resolved: Any) -> list[Path]:
    """The host paths a conversion reads, as real paths: model folder (and its symlinks' targets),
    tokenizer folder, calibration file. Nothing else of the host reaches the executor."""
    paths: list[Path] = []
    for folder in (resolved.model_dir, resolved.tokenizer_dir):
        if folder is not None:
            paths += [Path(folder).resolve(), *_symlink_target_dirs(Path(folder))]
    if resolved.spec.quantization.calibration.dataset is not None:
        paths.append(Path(calibration_source(resolved.spec)).resolve())
    # One mount per outermost path (a calibration file inside the model folder needs none of its own).
    distinct = list(dict.fromkeys(paths))
    return [p for p in distinct if not any(q in p.parents for q in distinct)]


def job_spec(resolved: Any) -> dict[str, Any]:
    """The spec the executor converts: the loaded spec with absolute real paths and the model as a local
    folder (a `repo_id` becomes its Hugging Face cache snapshot: the executor never downloads)."""
    spec = resolved.spec.model_dump(mode="json")
    model = spec["model"]
    model.update({"path": str(Path(resolved.model_dir).resolve()), "repo_id": None, "revision": None, "config": None})
    if resolved.spec.model.tokenizer is not None:
        model["tokenizer"] = str(Path(resolved.spec.model.tokenizer).resolve())
    calibration = spec["quantization"]["calibration"]
    if calibration["dataset"] is not None:
        calibration["dataset"] = str(Path(calibration["dataset"]).resolve())
    return spec


def job_dir_for(out_dir: Path) -> Path:
    """The job's private folder beside the store's temp dir (`.checkpoint-<key>-…-job`: the store
    removes it with the other leftovers of that key)."""
    out_dir = Path(out_dir)
    return out_dir.parent / f".{out_dir.name}{JOB_SUFFIX}"


def make_job(resolved: Any, out_dir: Path, *, device: str = "cuda", placeholders: bool = False,
             artifact: str = "trtllm") -> ConversionJob:
    """The conversion job for `resolved` into `out_dir` (`placeholders`: for a dry run of a spec whose
    weights are not at hand, the model folder is shown as <model.path>)."""
    target = resolved.spec.target
    if resolved.model_dir is None:
        if not placeholders:
            raise InvalidInput("the spec gives no model weights to convert",
                               fix="set model.path to a local HF folder (or model.repo_id + revision, downloaded)")
        read_only = [Path(MODEL_PLACEHOLDER)]
    else:
        read_only = conversion_inputs(resolved)
    return ConversionJob(job_dir=job_dir_for(out_dir), out_dir=Path(out_dir), read_only=read_only,
                         device=device, world_size=target.gpu_count or target.world_size,
                         artifact=artifact)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------ run


def make_conversion_executor(resolved: Any, build_plan: Any, *, progress: bool = True) -> Any:
    name = choose_executor_name(resolved)
    timeout_s = resolved.spec.backend.conversion_timeout
    if name == "local":
        return LocalExecutor(resolved.toolchain, target_sm=build_plan.gpu_sm, show_progress=progress,
                             timeout_s=timeout_s, configs=resolved.configs)
    if name == "docker":
        return DockerExecutor(resolved.toolchain, show_progress=progress, timeout_s=timeout_s, configs=resolved.configs)
    raise TrtpipeError(f"the {name} executor converts nothing: cpu-reference checkpoints convert in-process")


def preflight_conversion(resolved: Any, build_plan: Any, *, artifact: str = "trtllm") -> str:
    """In well under a second and before anything heavy: everything this host lacks to convert AND build
    there, in one line (exit 3). Returns the executor. The llm-api artifact (`artifact` "hf") is served, not
    built, so the local executor needs no trtllm-build binary for it."""
    name = choose_executor_name(resolved)
    if name == "local":
        LocalExecutor(resolved.toolchain, target_sm=build_plan.gpu_sm).preflight(
            conversion=True, need_build_binary=artifact != "hf")
    else:
        preflight(resolved, build_plan)  # docker: a pinned image and a daemon that answers
    return name


def convert_in_executor(
    resolved: Any, out_dir: Path, log_path: Path, *, build_plan: BuildPlan | None = None, progress: bool = True,
    executor: Any = None, device: str = "cuda", artifact: str = "trtllm",
) -> dict[str, Any]:
    """Convert `resolved`'s checkpoint into `out_dir` through the engine's executor; return what the build
    record keeps (the converter's summary, where it ran, its log).

    The checkpoint is validated here, on the host, against the spec (config and every tensor's name,
    dtype and shape; for `artifact` "hf", the llm-api export's files, declared quantization and llm_args.json)
    before the caller may commit it. `executor` and `device` are for tests."""
    if executor is None:
        build_plan = build_plan or make_build_plan(resolved)
        preflight_conversion(resolved, build_plan, artifact=artifact)
        executor = make_conversion_executor(resolved, build_plan, progress=progress)
    job = make_job(resolved, Path(out_dir), device=device, artifact=artifact)
    job.job_dir.mkdir(mode=0o700)
    try:
        staging = job.spec_path.with_name(".spec.json.tmp")
        staging.write_text(json.dumps(job_spec(resolved), indent=2) + "\n", encoding="utf-8")
        os.replace(staging, job.spec_path)
        result: ExecutorResult = executor.run_conversion(job, Path(log_path))
        if not job.summary_path.is_file():
            raise BuildFailed(f"checkpoint conversion ({executor.name}) exited 0 but wrote no summary; log: {log_path}",
                              fix="read the end of the log: the conversion's own message is there", log_path=log_path)
        summary_model = HfExportSummary if artifact == "hf" else ConvertSummary
        summary = summary_model.model_validate_json(job.summary_path.read_text(encoding="utf-8"))
    finally:
        shutil.rmtree(job.job_dir, ignore_errors=True)
    if artifact == "hf":
        validate_hf_artifact(Path(out_dir), resolved)
    else:
        validate_checkpoint(Path(out_dir), resolved.spec)
    return {
        "convert": summary.model_dump(mode="json"),
        "conversion": {"executor": result.executor, "image": result.image, "device": job.device,
                       "log": str(log_path), "seconds": round(result.duration_s, 3)},
    }


# ------------------------------------------------------------------------------------------------ dry run


def preview_conversion(resolved: Any, out_dir: Path, *, artifact: str = "trtllm") -> ConversionPreview:
    """Where and how the conversion of `resolved` would run, for `trtpipe build --dry-run`. Pure: no
    daemon, nothing written; a reason instead of a container where there can be none."""
    name = choose_executor_name(resolved)
    job = make_job(resolved, Path(out_dir), placeholders=True, artifact=artifact)
    if name == "local":
        executor = LocalExecutor(resolved.toolchain, target_sm=resolved.sm, check_host=False)
        preview = ConversionPreview(
            executor="local", command=executor.conversion_command(job),
            where=f"local executor: a child process in this host's TensorRT-LLM {resolved.toolchain.trtllm_version} "
                  "environment, on its GPUs",
        )
    else:
        try:
            spec = conversion_container_spec(resolved.toolchain, job, user=f"{os.getuid()}:{os.getgid()}",
                                             build_configs=resolved.configs)
        except TrtpipeError as err:
            return ConversionPreview(executor="docker", where=f"docker executor: {err.one_line()}", command=[],
                                     container={"unavailable": err.one_line()})
        preview = ConversionPreview(
            executor="docker", command=spec.command, container=spec.model_dump(mode="json"),
            where=f"docker executor: the container {spec.image_tag} on {job.world_size} GPU(s), not on this host",
        )
    return preview
