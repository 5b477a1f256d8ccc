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

from trtpipe.engine.executors.base import ExecutorResult, failure_from_log, run_logged_process
from trtpipe.errors import MissingCapability
from trtpipe.versions import TENSORRT_DISTRIBUTIONS, TRTLLM_DISTRIBUTIONS, installed_version

DEFAULT_TIMEOUT_S = 4 * 3600.0


def _same_release(installed: str, pinned: str) -> bool:
    """'1.2.1' matches '1.2.1' and '1.2.1.post1'; TensorRT '10.13.3.9' matches a pin of '10.13.3' or '10.13.3.9'."""
    inst = installed.split("+")[0].split(".post")[0]
    return inst == pinned or inst.startswith(pinned + ".") or pinned.startswith(inst + ".")


def host_gpus_with_sm(sm: int, probe: Any = None) -> list[Any]:
    """The host's GPUs of compute capability `sm` (via Foundation's NVML probe)."""
    from trtpipe.gpu import probe_host

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
    ) -> None:
        self.toolchain = toolchain
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
    def missing(self, *, need_build_binary: bool = True) -> list[str]:
        """What this host lacks for the toolchain's build, one short phrase each (empty: ready)."""
        missing: list[str] = []
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

    def preflight(self, *, need_build_binary: bool = True) -> None:
        missing = self.missing(need_build_binary=need_build_binary)
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
            raise failure_from_log("trtllm-build", log, outcome.returncode, reason=f"timed out after {self.timeout_s}s")
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
    def conversion_command(self, spec_path: Path, out_dir: Path) -> list[str]:
        """The command that converts/quantizes the spec's checkpoint in this environment."""
        return [sys.executable, "-m", "trtpipe.engine.convert_entry", "--spec", str(spec_path), "--out", str(out_dir)]

    def run_conversion(self, spec_path: Path, out_dir: Path, log: Path) -> ExecutorResult:
        """Run the checkpoint stage as a logged child process on this GPU host (ModelOpt uses the GPU)."""
        if self.check_host and self.target_sm is not None and not host_gpus_with_sm(self.target_sm, self.probe):
            raise MissingCapability(
                f"local checkpoint conversion needs a GPU with SM {self.target_sm}; none found on this host",
                fix="run it on the GPU builder or in the toolchain container (target.executor: docker)",
            )
        argv = self.conversion_command(spec_path, out_dir)
        env = dict(os.environ if self.env is None else self.env)
        outcome = run_logged_process(argv, log, timeout_s=self.timeout_s, env=env,
                                     show_progress=self.show_progress, title="checkpoint conversion")
        if outcome.timed_out or outcome.returncode != 0:
            raise failure_from_log("checkpoint conversion", log, outcome.returncode,
                                   reason="timed out" if outcome.timed_out else None)
        return ExecutorResult(executor=self.name, returncode=0, log_path=log, duration_s=outcome.duration_s,
                              command=argv)
