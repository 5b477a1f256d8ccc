"""The build spec: what a user writes in YAML to describe one build.

Only shape and single-field rules live here. Rules that need the GPU catalog, the toolchain
table or the model's config.json (SM checks, head counts) are applied by `trtpipe.resolve`,
which cites the YAML position of the offending field through `LoadedSpec.position`.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

CPU_REFERENCE = "cpu-reference"


class StrictModel(BaseModel):
    """Base for every spec section: unknown keys are refused, values are validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)


class Dtype(str, Enum):
    auto = "auto"
    float16 = "float16"
    bfloat16 = "bfloat16"


class QuantAlgo(str, Enum):
    none = "none"
    fp8 = "fp8"
    int4_awq = "int4_awq"
    w4a8_awq = "w4a8_awq"
    int8_sq = "int8_sq"
    int8_wo = "int8_wo"
    nvfp4 = "nvfp4"


class KvCacheDtype(str, Enum):
    auto = "auto"
    fp16 = "fp16"
    bf16 = "bf16"
    fp8 = "fp8"
    int8 = "int8"


class Profile(str, Enum):
    throughput = "throughput"
    latency = "latency"


class BatchSchedulerPolicy(str, Enum):
    max_utilization = "max_utilization"
    guaranteed_no_evict = "guaranteed_no_evict"


class Executor(str, Enum):
    auto = "auto"
    local = "local"
    docker = "docker"
    reference = "reference"


class ModelSection(StrictModel):
    """Where the Hugging Face model comes from."""

    path: Path | None = Field(default=None, description="Local HF model directory (safetensors).")
    repo_id: str | None = Field(default=None, description="HF Hub repo id, e.g. meta-llama/Meta-Llama-3-8B.")
    revision: str | None = Field(default=None, description="Pinned commit of repo_id (40 hex digits).")
    config: Path | None = Field(
        default=None,
        description="A config.json to plan with when the weights are not at hand (planning only).",
    )
    dtype: Dtype = Dtype.auto
    tokenizer: Path | None = Field(default=None, description="Tokenizer directory; defaults to the model's.")
    trust_remote_code: bool = False
    allow_pickle: bool = Field(default=False, description="Allow .bin/.pt (pickle) weights. Unsafe.")

    @field_validator("revision")
    @classmethod
    def _revision_is_commit(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if len(value) != 40 or any(c not in "0123456789abcdef" for c in value.lower()):
            raise ValueError(
                f"revision {value!r} is not a commit hash; pin the 40-hex-digit commit so builds are reproducible"
            )
        return value.lower()

    @model_validator(mode="after")
    def _one_source(self) -> ModelSection:
        if self.path is None and self.repo_id is None and self.config is None:
            raise ValueError(
                "no model source is given; set `path` (local HF folder), `repo_id` with `revision`, "
                "or `config` (a config.json, for planning only)"
            )
        if self.path is not None and self.repo_id is not None:
            raise ValueError("both `path` and `repo_id` are given; keep one of them")
        if self.repo_id is not None and self.revision is None:
            raise ValueError(
                "`repo_id` needs `revision` pinned to a commit hash; add `revision: <40-hex-digit commit>` "
                "so builds are reproducible"
            )
        return self


class TargetSection(StrictModel):
    """Which hardware the engine is built for."""

    gpu: str = Field(default=CPU_REFERENCE, description="A GPU name from the catalog, or cpu-reference.")
    tp: int = Field(default=1, ge=1, le=64)
    pp: int = Field(default=1, ge=1, le=64)
    gpu_count: int | None = Field(default=None, ge=1, le=512, description="Defaults to tp * pp.")
    executor: Executor = Executor.auto

    @property
    def world_size(self) -> int:
        return self.tp * self.pp

    @property
    def is_cpu_reference(self) -> bool:
        return self.gpu == CPU_REFERENCE

    @model_validator(mode="after")
    def _gpu_count_matches(self) -> TargetSection:
        if self.gpu_count is not None and self.gpu_count != self.tp * self.pp:
            raise ValueError(
                f"gpu_count {self.gpu_count} != tp*pp ({self.tp}*{self.pp}={self.tp * self.pp}); "
                f"set gpu_count to {self.tp * self.pp} or change tp/pp"
            )
        return self


class CalibrationSection(StrictModel):
    dataset: Path | None = Field(default=None, description="Plain text or JSONL (text field); default: shipped text.")
    text_field: str = "text"
    samples: int = Field(default=32, ge=1, le=100_000)
    max_seq_len: int = Field(default=256, ge=8, le=131_072)
    seed: int = Field(default=1234, ge=0)


class QuantizationSection(StrictModel):
    algo: QuantAlgo = QuantAlgo.none
    kv_cache: KvCacheDtype = KvCacheDtype.auto
    group_size: int = Field(default=128, description="INT4 AWQ group size.")
    calibration: CalibrationSection = Field(default_factory=CalibrationSection)

    @field_validator("group_size")
    @classmethod
    def _group_size_supported(cls, value: int) -> int:
        if value not in (32, 64, 128):
            raise ValueError(f"group_size {value} is not supported; use 32, 64 or 128")
        return value


class EngineSection(StrictModel):
    max_batch_size: int = Field(default=8, ge=1, le=4096)
    max_input_len: int = Field(default=1024, ge=1)
    max_seq_len: int = Field(default=2048, ge=2)
    max_num_tokens: int | None = Field(default=None, ge=1, description="Defaults per profile.")
    max_beam_width: int = Field(default=1, ge=1, le=16)
    tokens_per_block: int = Field(default=32, ge=8, le=1024)
    profile: Profile = Profile.throughput
    plugins: dict[str, str | bool | None] = Field(
        default_factory=dict,
        description="Explicit trtllm-build plugin overrides, e.g. {gemm_plugin: auto, use_fused_mlp: true}.",
    )

    @model_validator(mode="after")
    def _limits_consistent(self) -> EngineSection:
        if self.max_input_len > self.max_seq_len:
            raise ValueError(
                f"max_input_len {self.max_input_len} > max_seq_len {self.max_seq_len}; "
                "raise max_seq_len or lower max_input_len"
            )
        return self


class TritonSection(StrictModel):
    streaming: bool = True
    tensorrt_llm_instance_count: int = Field(default=1, ge=1, le=64)
    preprocessing_instance_count: int = Field(default=1, ge=1, le=64)
    postprocessing_instance_count: int = Field(default=1, ge=1, le=64)
    max_batch_size: int | None = Field(default=None, ge=1, description="Defaults to engine.max_batch_size.")
    kv_cache_free_gpu_mem_fraction: float = Field(default=0.9, gt=0.0, le=1.0)
    batch_scheduler_policy: BatchSchedulerPolicy = BatchSchedulerPolicy.max_utilization
    enable_chunked_context: bool = False
    enable_kv_cache_reuse: bool = False
    max_queue_delay_microseconds: int = Field(default=0, ge=0)


class BenchGate(StrictModel):
    """SLOs a bench result must meet (milliseconds)."""

    ttft_p99_ms: float | None = Field(default=None, gt=0)
    tpot_p99_ms: float | None = Field(default=None, gt=0)
    e2e_p99_ms: float | None = Field(default=None, gt=0)
    min_output_tokens_per_s: float | None = Field(default=None, gt=0)


class ChannelGates(StrictModel):
    """What promotion into one channel requires."""

    smoke: bool = True
    parity: bool = False
    bench: BenchGate | None = None
    max_regression_pct: float | None = Field(default=None, ge=0, le=100)


class ReleaseSection(StrictModel):
    gates: dict[str, ChannelGates] = Field(default_factory=dict)


class BuildSpec(StrictModel):
    """One build: model, target, quantization, engine limits, serving options, toolchain."""

    name: str | None = Field(default=None, description="Artifact name; defaults to the model directory name.")
    model: ModelSection
    target: TargetSection = Field(default_factory=TargetSection)
    quantization: QuantizationSection = Field(default_factory=QuantizationSection)
    engine: EngineSection = Field(default_factory=EngineSection)
    triton: TritonSection = Field(default_factory=TritonSection)
    toolchain: str | None = Field(default=None, description="A name from build_configs/toolchains.yaml.")
    release: ReleaseSection = Field(default_factory=ReleaseSection)

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if not value or "/" in value or "\\" in value or value.startswith(".") or len(value) > 128:
            raise ValueError(f"name {value!r} is not a plain name; use letters, digits, '-' or '_' (no slashes, no leading '.')")
        return value

    @property
    def artifact_name(self) -> str:
        if self.name:
            return self.name
        if self.model.path is not None:
            return self.model.path.name
        if self.model.repo_id is not None:
            return self.model.repo_id.split("/")[-1]
        assert self.model.config is not None
        return self.model.config.parent.name


SpecKind = Literal["build"]
