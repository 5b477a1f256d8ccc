"""The build spec: what a user writes in YAML to describe one build.

Only shape and single-field rules live here. Rules that need the GPU catalog, the toolchain
table or the model's config.json (SM checks, head counts) are applied by `trtpipe.resolve`,
which cites the YAML position of the offending field through `LoadedSpec.position`.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import Field, field_validator, model_validator

from trtpipe import quant
from trtpipe.names import name_fix, name_problem
from trtpipe.backend_options import StrictSection
from trtpipe.release.gate_models import ReleaseSection
from trtpipe.toolchain import BACKEND_CLASSES, backend_facts, default_backend

CPU_REFERENCE = "cpu-reference"
# The most GPUs one spec may target (target.gpu_count, and so tp * pp).
MAX_GPUS = 512
# torch.manual_seed takes seeds in [-2**63, 2**64 - 1] (torch/random.py, manual_seed's docstring); the
# calibration seed is passed to it, so a larger one would fail at conversion.
MAX_SEED = 2**64 - 1
# The backend section: one options model per registered backend (trtpipe.toolchain), chosen by `kind`.
BackendSection = Annotated[Union[tuple(cls.options for cls in BACKEND_CLASSES.values())],  # noqa: UP007
                           Field(discriminator="kind")]
StrictModel = StrictSection


class Dtype(str, Enum):
    auto = "auto"
    float16 = "float16"
    bfloat16 = "bfloat16"


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
    allow_external_links: bool = Field(
        default=False,
        description="Let files of the model (and tokenizer) folder be symlinks that resolve outside it. Off: every "
                    "file read from the folder must resolve inside it (a Hugging Face cache snapshot may resolve "
                    "into its repository's blobs/); see trtpipe/model_folder.py.")

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
    tp: int = Field(default=1, ge=1, le=64, description="Tensor parallelism: GPUs each layer is split over.")
    pp: int = Field(default=1, ge=1, le=64, description="Pipeline parallelism: stages the layers are split into.")
    gpu_count: int | None = Field(default=None, ge=1, le=MAX_GPUS, description="Defaults to tp * pp.")
    executor: Executor = Executor.auto

    @property
    def world_size(self) -> int:
        return self.tp * self.pp

    @property
    def is_cpu_reference(self) -> bool:
        return self.gpu == CPU_REFERENCE

    @model_validator(mode="after")
    def _gpu_count_matches(self) -> TargetSection:
        if self.tp * self.pp > MAX_GPUS:
            raise ValueError(
                f"tp {self.tp} x pp {self.pp} = {self.tp * self.pp} GPUs exceeds the {MAX_GPUS} a spec may target; "
                f"lower tp or pp so that tp*pp is at most {MAX_GPUS}"
            )
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
    seed: int = Field(default=1234, ge=0, le=MAX_SEED, description="Seeds the sample order and torch.")


class QuantizationSection(StrictModel):
    algo: str = Field(default="none", description="Weight quantization: a format of trtpipe/quant.py.")
    kv_cache: str = Field(default="auto", description="KV cache dtype: auto (the weights'), fp16, bf16, fp8.")
    group_size: int = Field(default=128, description="AWQ group size (int4_awq, w4a8_awq).")
    calibration: CalibrationSection = Field(default_factory=CalibrationSection)
    converter: Literal["auto", "modelopt"] = Field(
        default="auto",
        description="auto: stream unquantized weights tensor by tensor and calibrate layer by layer where trtpipe "
        "can (the same checkpoint bytes, a fraction of the memory); modelopt: always load the whole model into "
        "ModelOpt (for comparison). Not part of the checkpoint key.")

    @field_validator("algo")
    @classmethod
    def _known_format(cls, value: str) -> str:
        if value not in quant.FORMATS:
            raise ValueError(f"{value!r} is not a quantization format; use one of: "
                             f"{', '.join(quant.convertible_formats())}")
        return value

    @field_validator("kv_cache")
    @classmethod
    def _known_kv_cache(cls, value: str) -> str:
        if value not in quant.KV_CACHES:
            offered = [k.name for k in quant.KV_CACHES.values() if k.refused is None]
            raise ValueError(f"{value!r} is not a KV cache dtype; use one of: {', '.join(offered)}")
        return value

    @field_validator("group_size")
    @classmethod
    def _group_size_supported(cls, value: int) -> int:
        if value not in quant.GROUP_SIZES:
            *most, last = quant.GROUP_SIZES
            raise ValueError(f"group_size {value} is not supported; use {', '.join(map(str, most))} or {last}")
        return value


class LimitsSection(StrictModel):
    """What the artifact is sized for, whichever backend builds it."""

    max_batch_size: int = Field(default=8, ge=1, le=4096)
    max_input_len: int = Field(default=1024, ge=1)
    max_seq_len: int = Field(default=2048, ge=2)
    max_num_tokens: int | None = Field(default=None, ge=1, description="Defaults per profile.")
    max_beam_width: int = Field(default=1, ge=1, le=16)
    tokens_per_block: int = Field(default=32, ge=8, le=1024)
    profile: Profile = Profile.throughput

    @model_validator(mode="after")
    def _limits_consistent(self) -> LimitsSection:
        if self.max_input_len > self.max_seq_len:
            raise ValueError(
                f"max_input_len {self.max_input_len} > max_seq_len {self.max_seq_len}; "
                "raise max_seq_len or lower max_input_len"
            )
        return self


class RuntimeSection(StrictModel):
    """How the served model schedules and caches, in backend-neutral names (each backend maps them: the
    inflight_batcher_llm parameters, or the LLM() arguments)."""

    streaming: bool | None = Field(
        default=None,
        description="Deploy decoupled, so clients may stream. Default: the backend's upstream layout's (true, "
                    "except on llm-api, whose upstream model.yaml has triton_config.decoupled: False).")
    kv_cache_free_fraction: float = Field(default=0.9, gt=0.0, le=1.0,
                                          description="Share of free GPU memory the KV cache takes.")
    scheduler_policy: BatchSchedulerPolicy = BatchSchedulerPolicy.max_utilization
    chunked_prefill: bool = Field(default=False, description="Split long prompts over steps.")
    kv_cache_reuse: bool = Field(default=False, description="Reuse KV cache blocks across requests.")


def target_default_backend(data: dict[str, Any]) -> str:
    """The backend a spec's data builds with when it names none: its target's default (trtpipe.toolchain)."""
    target = data.get("target")
    gpu = target.get("gpu", CPU_REFERENCE) if isinstance(target, dict) else CPU_REFERENCE
    return default_backend("cpu" if gpu == CPU_REFERENCE else "gpu")


class BuildSpec(StrictModel):
    """One build: model, target, quantization, limits, runtime knobs, the backend's own section, toolchain."""

    name: str | None = Field(default=None, description="Artifact name; defaults to the model directory name.")
    model: ModelSection
    target: TargetSection = Field(default_factory=TargetSection)
    quantization: QuantizationSection = Field(default_factory=QuantizationSection)
    limits: LimitsSection = Field(default_factory=LimitsSection)
    runtime: RuntimeSection = Field(default_factory=RuntimeSection)
    backend: BackendSection = Field(
        description="How the artifact is built and served, and that backend's own settings: `kind` is "
                    "trtllm-build, llm-api (TensorRT-LLM's PyTorch backend behind Triton's llmapi model; on "
                    "cpu-reference the reference runtime serves it) or reference; default: reference for target "
                    "cpu-reference, else trtllm-build. The toolchain must offer it.")
    toolchain: str | None = Field(default=None, description="A name from build_configs/toolchains.yaml.")
    allow_preview: bool = Field(
        default=False,
        description="Opt in to a preview toolchain (a TensorRT-LLM pre-release, named in full in `toolchain`).")
    release: ReleaseSection = Field(default_factory=ReleaseSection)

    @model_validator(mode="before")
    @classmethod
    def _backend_kind_default(cls, data: Any) -> Any:
        # A spec that names no backend (or gives its section without `kind`) builds with its target's default.
        if not isinstance(data, dict):
            return data
        backend = data.get("backend")
        if backend is None or (isinstance(backend, dict) and "kind" not in backend):
            data = {**data, "backend": {**(backend or {}), "kind": target_default_backend(data)}}
        return data

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str | None) -> str | None:
        if value is None:
            return value
        problem = name_problem("name", value)
        if problem:
            raise ValueError(f"{problem}; {name_fix('artifact name')}")
        return value

    @model_validator(mode="after")
    def _streaming_default(self) -> BuildSpec:
        # The default follows the backend's upstream layout (trtpipe.toolchain.BackendFacts.streams_by_default).
        if self.runtime.streaming is None:
            self.runtime.streaming = backend_facts(self.backend_kind).streams_by_default
        return self

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

    def serving_settings(self) -> dict[str, Any]:
        """What the spec sets that shapes its published repository (part of the repository's key). The runtime
        knobs keep the names the key has always given them (the earlier triton section's), so a trtllm-build or
        reference repository keeps its key across the spec's change of shape."""
        runtime = self.runtime
        return {
            "streaming": runtime.streaming,
            "kv_cache_free_gpu_mem_fraction": runtime.kv_cache_free_fraction,
            "batch_scheduler_policy": runtime.scheduler_policy.value,
            "enable_chunked_context": runtime.chunked_prefill,
            "enable_kv_cache_reuse": runtime.kv_cache_reuse,
            **self.backend.serving_settings(),
        }

    @property
    def backend_kind(self) -> str:
        """The backend that builds this spec (its section's `kind`)."""
        return self.backend.kind
