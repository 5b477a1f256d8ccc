"""The engine build plan: a resolved spec's trtllm-build configuration, as the command that builds it.

The configuration - every limit and plugin/feature setting, with the reason for each, following the
pinned trtllm-build's own rules - is derived by trtpipe.trtllm_build.config, the same derivation
`trtpipe.resolve` checks every spec with: a spec that resolves has a plan. `make_build_plan(resolved)`
packages it with the toolchain and target; `render_command` refuses (as a last guard) any command
the flag table or the rules would refuse or change.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, computed_field

from trtpipe.errors import TrtpipeError
from trtpipe.trtllm_build.config import RuleViolation, flag_table
from trtpipe.trtllm_build.flags import FlagContract, load_contract, render_value
from trtpipe.trtllm_build.rules import BuildFacts, load_rules, simulate_command

LIMIT_KEYS = ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens", "opt_num_tokens", "max_beam_width")


class BuildPlan(BaseModel):
    """Everything trtllm-build is told, with the reason for each setting."""

    model_config = ConfigDict(extra="forbid")

    toolchain: str
    flags: str  # the flag table the command is checked against (build_configs/trtllm_build_flags/<flags>.yaml)
    trtllm_version: str
    tensorrt_version: str | None
    target_gpu: str
    gpu_sm: int | None
    gpu_product: str | None
    family: str
    profile: str
    tp: int
    pp: int
    dtype: str
    quant_algo: str
    kv_cache_dtype: str
    limits: dict[str, int | str | None]
    plugin_config: dict[str, str | bool | int | None]
    why: dict[str, str]
    overrides: list[str]
    workers: int = 1
    log_level: str = "info"
    architecture: str | None = None  # the model's architecture (config.json), which some trtllm-build rules test
    # The build_configs/ folder its flag contract and rules are read from (the resolution's); not part of the plan's
    # content (records and the memo hold the plan without it).
    configs: Path | None = Field(default=None, exclude=True)

    @property
    def world_size(self) -> int:
        return self.tp * self.pp

    @property
    def is_reference(self) -> bool:
        return self.gpu_sm is None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def build_config(self) -> dict[str, Any]:
        """The build config as TRT-LLM's engine config.json nests it (limits + plugin_config)."""
        return {**self.limits, "plugin_config": dict(self.plugin_config)}

    def contract(self) -> FlagContract:
        return load_contract(self.flags, self.configs)

    def facts(self) -> BuildFacts:
        """What the pinned trtllm-build will know beyond the command: checkpoint quantization, architecture, tp, SM."""
        return BuildFacts.for_recipe(self.quant_algo, self.kv_cache_dtype, architecture=self.architecture,
                                     tp_size=self.tp, sm=self.gpu_sm)

    def render_command(
        self, checkpoint_dir: Path | str, output_dir: Path | str, *, executable: str = "trtllm-build"
    ) -> list[str]:
        """The trtllm-build argv for this plan, using exactly the flags the toolchain's version accepts."""
        argv = [
            executable,
            "--checkpoint_dir", str(checkpoint_dir),
            "--output_dir", str(output_dir),
        ]
        for key in LIMIT_KEYS:
            if self.limits[key] is not None:  # opt_num_tokens is left out with multiple profiles
                argv += [f"--{key}", str(self.limits[key])]
        argv += ["--kv_cache_type", str(self.limits["kv_cache_type"])]
        for key, value in self.plugin_config.items():
            argv += [f"--{key}", render_value(value)]
        argv += ["--workers", str(self.workers), "--log_level", self.log_level]
        problems = self.contract().check_command(argv)
        if problems:
            raise TrtpipeError(
                f"the build plan does not fit trtllm-build {self.trtllm_version}: {'; '.join(problems)}",
                fix="fix backend.plugins in the spec or the flag contract table",
            )
        # The pinned trtllm-build's own rules: a command it would refuse, or build with other settings
        # than it names, never leaves trtpipe.
        findings = simulate_command(self.toolchain, argv, self.facts(), table=load_rules(configs=self.configs)).findings
        if findings:
            raise TrtpipeError(
                "; ".join(f.message for f in findings),
                fix="the plan must follow trtllm-build's rules (build_configs/trtllm_build_flags/rules.yaml); "
                "change backend.plugins or report the plan that produced this command",
            )
        return argv


def make_build_plan(resolved: Any) -> BuildPlan:
    """The complete build configuration of a resolved spec (see the module doc)."""
    spec, toolchain, gpu = resolved.spec, resolved.toolchain, resolved.gpu
    try:
        config = resolved.engine_config()
    except RuleViolation as violation:  # resolve refuses these first; a spec changed after resolving lands here
        raise resolved.error(violation.field_path, violation.message, violation.fix) from None
    archs = (resolved.model_config or {}).get("architectures") or []
    return BuildPlan(
        toolchain=toolchain.name,
        flags=flag_table(toolchain),
        trtllm_version=toolchain.trtllm_version,
        tensorrt_version=toolchain.tensorrt_version,
        target_gpu=spec.target.gpu,
        gpu_sm=gpu.sm if gpu is not None else None,
        gpu_product=gpu.product if gpu is not None else None,
        family=config.family,
        profile=spec.limits.profile.value,
        tp=spec.target.tp,
        pp=spec.target.pp,
        dtype=resolved.weight_dtype,
        quant_algo=spec.quantization.algo,
        kv_cache_dtype=spec.quantization.kv_cache,
        limits=config.limits,
        plugin_config=config.plugin_config,
        why=config.why,
        overrides=config.overrides,
        # One build worker per rank: each rank's engine is built on its own GPU, in parallel.
        workers=spec.target.world_size if gpu is not None else 1,
        architecture=archs[0] if archs else None,
        configs=resolved.configs,
    )
