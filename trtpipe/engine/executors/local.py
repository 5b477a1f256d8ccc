"""The local executor: runs the pinned `trtllm-build` from this Python environment on this host's GPU.

Before anything starts it checks, cheaply (package metadata, PATH, NVML; no import of tensorrt_llm),
that the installed TensorRT-LLM and TensorRT are the toolchain's versions and that a GPU of the
target SM is present. Anything missing is reported in ONE MissingCapability line naming all of it.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

from trtpipe.engine.executors.base import (
    ConversionJob,
    ExecutorResult,
    conversion_failure,
    failure_from_log,
    run_logged_process,
    timed_out,
)
from trtpipe.errors import MissingCapability
from trtpipe.gpu import probe_host
from trtpipe.shipped import package_dir
from trtpipe.backend_options import DEFAULT_TIMEOUT_S
from trtpipe.versions import TENSORRT_DISTRIBUTIONS, TRTLLM_DISTRIBUTIONS, installed_version, versions_match

# What a conversion process gets in its environment on every executor: Hugging Face offline (the
# model is local: a conversion never downloads), and the fixed cuBLAS workspace that PyTorch's
# reproducibility notes require for repeatable cuBLAS results (the same GPU model, the same inputs).
CONVERSION_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}


def _same_release(installed: str, pinned: str) -> bool:
    """'1.2.1' matches '1.2.1' and '1.2.1.post1'; TensorRT '10.13.3.9' matches a pin of '10.13.3' or '10.13.3.9'."""
    inst = installed.split("+")[0].split(".post")[0]
    return inst == pinned or inst.startswith(pinned + ".") or pinned.startswith(inst + ".")


def host_gpus_with_sm(sm: int, probe: Any = None) -> list[Any]:
    """The host's GPUs of compute capability `sm` (via Foundation's NVML probe)."""
    try:
        host = probe_host(probe)
    except Exception:  # no driver / no NVML: the same as no GPU for our purpose
        return []
    return [g for g in getattr(host, "gpus", []) or [] if getattr(g, "sm", None) == sm]


class LocalExecutor:
    name = "local"

    def __init__(
        self,
        toolchain: Any,
        *,
        target_sm: int | None,
        executable: list[str] | str | None = None,
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
        check_host: bool = True,
        probe: Any = None,
        show_progress: bool = True,
        env: dict[str, str] | None = None,
        configs: Path | None = None,
    ) -> None:
        self.toolchain = toolchain
        self.configs = configs  # the build_configs/ folder the conversion child reads (None: as its environment says)
        self.target_sm = target_sm
        # A list lets a test (or a wrapper such as `mpirun -n 4`) stand in front of the binary.
        if executable is None:
            executable = ["trtllm-build"]
        self.executable = [executable] if isinstance(executable, str) else list(executable)
        self.timeout_s = timeout_s
        self.check_host = check_host
        self.probe = probe
        self.show_progress = show_progress
        self.env = env

    # -- preflight -------------------------------------------------------------------------
    def missing(self, *, need_build_binary: bool = True, conversion: bool = False) -> list[str]:
        """What this host lacks for the toolchain's build, one short phrase each (empty: ready).

        `conversion`: also the ModelOpt and transformers the toolchain pins (the checkpoint key records
        those pins, so a conversion here must run with exactly them)."""
        missing: list[str] = []
        if conversion:
            missing += self.missing_converter_packages()
        want_llm = self.toolchain.trtllm_version
        have_llm = installed_version(*TRTLLM_DISTRIBUTIONS)
        if have_llm is None:
            missing.append(f"TensorRT-LLM {want_llm} (not installed)")
        elif not _same_release(have_llm, want_llm):
            missing.append(f"TensorRT-LLM {want_llm} (found {have_llm})")
        want_trt = self.toolchain.tensorrt_version
        have_trt = installed_version(*TENSORRT_DISTRIBUTIONS)
        if have_trt is None:
            missing.append(f"TensorRT {want_trt} (not installed)")
        elif not _same_release(have_trt, want_trt):
            missing.append(f"TensorRT {want_trt} (found {have_trt})")
        if need_build_binary and shutil.which(self.executable[0]) is None:
            missing.append(f"{self.executable[0]} on PATH")
        if self.target_sm is not None and not host_gpus_with_sm(self.target_sm, self.probe):
            missing.append(f"a GPU with SM {self.target_sm} (none found)")
        return missing

    def missing_converter_packages(self) -> list[str]:
        """ModelOpt / transformers that are absent or differ from the toolchain's pins (metadata only)."""
        missing: list[str] = []
        pins = {"nvidia-modelopt": self.toolchain.modelopt_version,
                "transformers": self.toolchain.transformers_version}
        for distribution, pinned in pins.items():
            have = installed_version(distribution)
            if pinned is None:
                continue  # trtpipe.engine.conversion refuses unpinned toolchains before asking
            if have is None:
                missing.append(f"{distribution} {pinned} (not installed)")
            elif not versions_match(have, str(pinned)):
                missing.append(f"{distribution} {pinned} (found {have})")
        return missing

    def preflight(self, *, need_build_binary: bool = True, conversion: bool = False) -> None:
        missing = self.missing(need_build_binary=need_build_binary, conversion=conversion)
        if missing:
            raise MissingCapability(
                f"local executor ({self.toolchain.name}) cannot run on this host: missing {', '.join(missing)}",
                fix="build on a GPU host with the pinned toolchain installed, set target.executor: docker, "
                "or use target.gpu: cpu-reference",
            )

    # -- build -----------------------------------------------------------------------------
    def run(self, plan: Any, checkpoint_dir: Path, out_dir: Path, log: Path) -> ExecutorResult:
        if self.check_host:
            self.preflight()
        argv = plan.render_command(checkpoint_dir, out_dir, executable=self.executable[0])
        argv = self.executable + argv[1:]
        outcome = run_logged_process(
            argv, log, timeout_s=self.timeout_s, env=self.env, show_progress=self.show_progress,
            title=f"trtllm-build {plan.trtllm_version}",
        )
        if outcome.timed_out:
            raise timed_out("trtllm-build", self.timeout_s, log, spec_field="backend.build_timeout")
        if outcome.returncode != 0:
            raise failure_from_log("trtllm-build", log, outcome.returncode)
        return ExecutorResult(
            executor=self.name,
            returncode=outcome.returncode,
            log_path=log,
            duration_s=outcome.duration_s,
            command=argv,
            tensorrt_version=installed_version(*TENSORRT_DISTRIBUTIONS),
            gpu_sm=self.target_sm,
        )

    # -- checkpoint conversion on the GPU host (checkpoints too big for a CPU runner) ------
    def conversion_command(self, job: ConversionJob) -> list[str]:
        """The command that runs the job's conversion in this Python environment."""
        return [sys.executable, "-m", "trtpipe.engine.convert_entry", *job.entry_arguments()]

    def conversion_env(self) -> dict[str, str]:
        """The child's environment: ours, with THIS trtpipe first on PYTHONPATH (the child converts with
        the code that computed the key), offline Hugging Face, and cuBLAS's reproducible workspace."""
        env = dict(os.environ if self.env is None else self.env)
        source_root = str(package_dir().resolve().parent)
        env["PYTHONPATH"] = os.pathsep.join([source_root, *filter(None, [env.get("PYTHONPATH")])])
        env.update(CONVERSION_ENV)
        if self.configs is not None:  # the child resolves the spec with the tables this build resolved it with
            env["TRTPIPE_BUILD_CONFIGS"] = str(self.configs)
        return env

    def run_conversion(self, job: ConversionJob, log: Path) -> ExecutorResult:
        """Run the conversion as a logged child process on this host (ModelOpt calibrates on its GPUs)."""
        if self.check_host:
            missing = self.missing_converter_packages()
            if job.device == "cuda" and self.target_sm is not None and not host_gpus_with_sm(self.target_sm, self.probe):
                missing.append(f"a GPU with SM {self.target_sm} (none found)")
            if missing:
                raise MissingCapability(
                    f"local checkpoint conversion ({self.toolchain.name}) cannot run on this host: "
                    f"missing {', '.join(missing)}",
                    fix="convert on the GPU builder with the pinned toolchain installed, or set target.executor: docker",
                )
        argv = self.conversion_command(job)
        outcome = run_logged_process(argv, log, timeout_s=self.timeout_s, env=self.conversion_env(),
                                     show_progress=self.show_progress, title="checkpoint conversion")
        if outcome.timed_out:
            raise timed_out("checkpoint conversion (local)", self.timeout_s, log, spec_field="backend.conversion_timeout")
        if outcome.returncode != 0:
            raise conversion_failure(log, outcome.returncode, where="local")
        return ExecutorResult(executor=self.name, returncode=0, log_path=log, duration_s=outcome.duration_s,
                              command=argv, gpu_sm=self.target_sm if job.device == "cuda" else None)
