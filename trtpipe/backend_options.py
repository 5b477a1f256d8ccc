"""Each backend's section of the build spec (`backend:`), one strict model per backend, told apart by `kind`.

The build spec's other sections are backend-neutral (limits, runtime knobs); what only one backend reads lives
here, on its own model, so a field written for another backend is refused at its YAML position by the schema
(`extra="forbid"`), and `not_offered` says why it has no place there. The models follow TensorRT-LLM's
`llmapi/llm_args.py` (common arguments, per-backend arguments, nested strict models) and Truss's
`trt_llm_config.py` (a discriminated union selects the stack and refuses fields outside it).

A backend class in trtpipe.toolchain names its options model (`options`); trtpipe.spec builds the union from them.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_TIMEOUT_S = 4 * 3600.0
MAX_TIMEOUT_S = 7 * 24 * 3600.0
# Triton's model configuration holds dynamic_batching.max_queue_delay_microseconds as a uint64
# (triton-inference-server/common protobuf/model_config.proto:1139 @83adf7cf, ModelDynamicBatching):
# a larger number in config.pbtxt is refused when Triton parses the model configuration.
MAX_QUEUE_DELAY_US = 2**64 - 1


class StrictSection(BaseModel):
    """Base for every spec section: unknown keys are refused, values are validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)


class InflightTritonOptions(StrictSection):
    """How the inflight_batcher_llm repository's Triton models are configured (config.pbtxt of each model)."""

    max_batch_size: int | None = Field(default=None, ge=1, description="Triton's max_batch_size; defaults to "
                                       "limits.max_batch_size.")
    max_queue_delay_microseconds: int = Field(default=0, ge=0, le=MAX_QUEUE_DELAY_US,
                                              description="Triton's dynamic batcher queue delay.")
    tensorrt_llm_instance_count: int = Field(default=1, ge=1, le=64)
    preprocessing_instance_count: int = Field(default=1, ge=1, le=64)
    postprocessing_instance_count: int = Field(default=1, ge=1, le=64)


class BackendOptions(StrictSection):
    """What every backend's section holds. `not_offered`: fields other backends have that this one has not,
    with why (the refusal of such a field says it)."""

    not_offered: ClassVar[dict[str, str]] = {}

    conversion_timeout: float = Field(
        default=DEFAULT_TIMEOUT_S, gt=0, le=MAX_TIMEOUT_S,
        description="Seconds the checkpoint conversion (or HF export) may run before it is stopped.")

    def serving_settings(self) -> dict[str, Any]:
        """The settings of this section that shape the published repository (part of its key)."""
        return {}


class EngineBackendOptions(BackendOptions):
    """A backend that builds an engine-shaped artifact served by the inflight_batcher_llm repository."""

    plugins: dict[str, str | bool | None] = Field(
        default_factory=dict,
        description="Explicit trtllm-build plugin overrides, e.g. {gemm_plugin: auto, use_fused_mlp: true}.")
    build_timeout: float = Field(default=DEFAULT_TIMEOUT_S, gt=0, le=MAX_TIMEOUT_S,
                                 description="Seconds the engine build (trtllm-build) may run before it is stopped.")
    triton: InflightTritonOptions = Field(default_factory=InflightTritonOptions)

    def serving_settings(self) -> dict[str, Any]:
        return self.triton.model_dump(mode="json")


class TrtllmBuildOptions(EngineBackendOptions):
    """backend: trtllm-build (a TensorRT engine built by the pinned `trtllm-build`)."""

    kind: Literal["trtllm-build"] = "trtllm-build"


class ReferenceOptions(EngineBackendOptions):
    """backend: reference (the TRT-LLM checkpoint run by trtpipe's PyTorch runtime; cpu-reference only)."""

    kind: Literal["reference"] = "reference"


class LlmApiOptions(BackendOptions):
    """backend: llm-api (ModelOpt's HF export run by `tensorrt_llm.LLM` behind Triton's llmapi model)."""

    not_offered: ClassVar[dict[str, str]] = {
        "plugins": "trtllm-build plugin settings; the PyTorch backend builds no TensorRT engine and has no plugins "
                   "(its kernels are chosen at run time)",
        "build_timeout": "no trtllm-build runs; backend.conversion_timeout bounds the HF export",
        "triton": "the llmapi repository is one Triton model with max_batch_size 0: TensorRT-LLM's own scheduler "
                  "batches requests (up to limits.max_batch_size), it has no pre- or postprocessing model, and one "
                  "LLM instance owns the model's GPUs",
    }

    kind: Literal["llm-api"] = "llm-api"
