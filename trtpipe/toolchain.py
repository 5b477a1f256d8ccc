"""Pinned toolchains: which TensorRT-LLM release goes with which TensorRT, CUDA, PyTorch ... and container.

The table lives in `build_configs/toolchains.yaml` (one copy, user-facing), found by `trtpipe.shipped` (the
package's copy in a wheel, the repository's in a checkout, or $TRTPIPE_BUILD_CONFIGS); a caller may pass
another path. A fact that could not be confirmed is `null` in the file (None here), never guessed.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from trtpipe.backend_options import BackendOptions, LlmApiOptions, ReferenceOptions, TrtllmBuildOptions
from trtpipe.datafiles import load_table
from trtpipe.errors import TrtpipeError
# Re-exported: tests and older callers import it from here; trtpipe.shipped owns the answer.
from trtpipe.shipped import configs_dir

# trtllm-build (the engine path this tool drives) and the C++ Triton backend were removed after the 1.2 line
# (TensorRT-LLM PRs #15763, #15767, #15907, #15918). Lines after it offer only the LLM-API backend; trtpipe pins
# such a line only as a preview (a pre-release that a spec opts into: `allow_preview: true`).
LAST_SUPPORTED_LINE = (1, 2)
REMOVAL_REASON = (
    "TensorRT-LLM removed `trtllm-build` and the C++ Triton backend after the 1.2 line (PRs #15763, #15767, "
    "#15907, #15918), so trtpipe pins stable toolchains up to 1.2.x only"
)


class BackendFacts(BaseModel):
    """What the rest of trtpipe asks of a backend, declared once on its class (`facts`) instead of compared by
    name: resolve, the spec's defaults, parity and the stages read these. A backend is registered here alone:
    trtpipe.stages builds its stages from its `artifact`, `runs_on` and `layout` (BACKEND_STAGES)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Where it builds for: a GPU target, cpu-reference, or either (on cpu-reference the reference runtime runs it).
    runs_on: Literal["gpu", "cpu", "any"]
    # What resolve derives for it (and the plan step shows): the trtllm-build configuration, or the LLM() arguments.
    derives: Literal["engine-config", "llm-args"]
    # What it converts the model into: a TensorRT-LLM checkpoint, or a Hugging Face export (parity converts the same).
    artifact: Literal["trtllm-checkpoint", "hf-export"]
    # Whether its deployments stream by default (its upstream layout's default decoupled setting).
    streams_by_default: bool
    # Whether the GPU catalog's precisions decide a quantized KV cache (False: the backend's own hardware rules do).
    kv_cache_needs_catalog_precision: bool
    # The Triton repository layout its publish stage writes (a name of trtpipe.serving.layouts.LAYOUTS).
    layout: str
    # What runs the model it builds on a GPU target (trtpipe.model_semantics.RUNTIMES: how each runtime keeps a
    # config.json field that changes what the model computes). On cpu-reference the reference runtime serves it.
    runtime: Literal["tensorrt-engine", "pytorch-llm-api", "reference"]
    # The target it is the default backend for when a spec names none ("gpu", "cpu"), if any.
    default_on: Literal["gpu", "cpu"] | None = None


class TrtllmBuildBackend(BaseModel):
    """The engine path: TRT-LLM checkpoint -> `trtllm-build` engine -> Triton `inflight_batcher_llm` repository
    (the C++ tensorrtllm backend). TensorRT-LLM 1.2.x and older only."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    facts: ClassVar[BackendFacts] = BackendFacts(
        runs_on="gpu", derives="engine-config", artifact="trtllm-checkpoint", streams_by_default=True,
        kv_cache_needs_catalog_precision=True, layout="inflight_batcher_llm", runtime="tensorrt-engine",
        default_on="gpu")
    # Its section of the build spec (`backend: {kind: trtllm-build, ...}`).
    options: ClassVar[type[BackendOptions]] = TrtllmBuildOptions

    kind: Literal["trtllm-build"] = "trtllm-build"
    flags: str = Field(description="The trtllm-build flag table: build_configs/trtllm_build_flags/<flags>.yaml.")


class ReferenceBackend(BaseModel):
    """The CPU reference: the TRT-LLM checkpoint in an engine-shaped directory, executed by trtpipe's PyTorch
    runtime behind the same Triton contract (for validation anywhere; never fast, never TensorRT)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    facts: ClassVar[BackendFacts] = BackendFacts(
        runs_on="cpu", derives="engine-config", artifact="trtllm-checkpoint", streams_by_default=True,
        kv_cache_needs_catalog_precision=True, layout="inflight_batcher_llm", runtime="reference",
        default_on="cpu")
    options: ClassVar[type[BackendOptions]] = ReferenceOptions

    kind: Literal["reference"] = "reference"


class LlmApiBackend(BaseModel):
    """The LLM-API path: ModelOpt's unified Hugging Face export -> Triton's `llmapi` Python model, which runs
    `tensorrt_llm.LLM` on TensorRT-LLM's PyTorch backend with the artifact's `llm_args.json` as its arguments.
    TensorRT-LLM 1.2.1 and later. On target cpu-reference the same artifact is run by trtpipe's reference runtime
    behind the same Triton contract."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    # Upstream's llmapi model.yaml ships decoupled: False (tensorrtllm_backend c2e65b88
    # all_models/llmapi/tensorrt_llm/1/model.yaml), and its llmapi_client.py calls it unary; the PyTorch backend's
    # own hardware matrix decides the KV cache (trtpipe.llm_api.derive).
    facts: ClassVar[BackendFacts] = BackendFacts(
        runs_on="any", derives="llm-args", artifact="hf-export", streams_by_default=False,
        kv_cache_needs_catalog_precision=False, layout="llmapi",
        runtime="pytorch-llm-api")
    options: ClassVar[type[BackendOptions]] = LlmApiOptions

    kind: Literal["llm-api"] = "llm-api"
    args: str = Field(description="The release's TorchLlmArgs table: build_configs/llm_api_args/<args>.yaml.")


class TritonContainer(BaseModel):
    """One Triton TRT-LLM container release and which backends it can serve."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    image: str
    backends: list[str]
    source: str


# One toolchain line offers one or more backends; `kind` tells them apart (a tagged union). A new
# backend is one more class here (its facts choose its stages and layout) and its toolchains' lines in
# build_configs/toolchains.yaml; a new repository layout is one more entry in trtpipe.serving.layouts.
Backend = Annotated[TrtllmBuildBackend | ReferenceBackend | LlmApiBackend, Field(discriminator="kind")]
BACKEND_CLASSES: dict[str, type[TrtllmBuildBackend | ReferenceBackend | LlmApiBackend]] = {
    cls.model_fields["kind"].default: cls for cls in (TrtllmBuildBackend, ReferenceBackend, LlmApiBackend)}
BACKEND_KINDS = tuple(BACKEND_CLASSES)


def backend_facts(kind: str) -> BackendFacts:
    """The facts of the backend `kind` (one of BACKEND_KINDS)."""
    return BACKEND_CLASSES[kind].facts


def default_backend(target: Literal["gpu", "cpu"]) -> str:
    """The backend a spec that names none builds with on a `target` of that kind."""
    return next(kind for kind in BACKEND_KINDS if backend_facts(kind).default_on == target)


class Toolchain(BaseModel):
    """One pinned TensorRT-LLM release and everything that must match it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description='e.g. "trtllm-1.2.1"')
    trtllm_version: str
    tensorrt_version: str | None = Field(description="Full 4-part version, e.g. 10.13.3.9.")
    cuda_version: str | None
    torch_version: str | None
    modelopt_version: str | None
    transformers_version: str | None
    triton_container: str | None = Field(description="Full NGC image ref of the Triton trtllm-python-py3 container.")
    triton_container_digest: str | None = None
    min_driver: str | None = Field(description="Minimum Linux driver for the container's CUDA (data-center GPUs).")
    sm_min: int
    sm_max: int
    python_version: str | None = None
    backends: list[Backend] = Field(description="The backends this release builds and serves with.")
    removed_backends: dict[str, str] = Field(
        default_factory=dict, description="Backends older lines offered that this release removed: kind -> why.")
    triton_containers: list[TritonContainer] = Field(
        default_factory=list, description="The Triton containers that carry this release, and what each serves.")
    preview: str | None = Field(
        default=None, description="Why this line is a preview (a pre-release); a spec opts in with allow_preview.")
    sources: dict[str, str] = Field(default_factory=dict, description="Where each fact comes from.")

    @property
    def version_tuple(self) -> tuple[int, ...]:
        return version_tuple(self.trtllm_version)

    def backend(self, kind: str) -> TrtllmBuildBackend | ReferenceBackend | LlmApiBackend | None:
        """This toolchain's backend of that kind, or None when it offers none."""
        return next((b for b in self.backends if b.kind == kind), None)

    def supports_sm(self, sm: int) -> bool:
        return self.sm_min <= sm <= self.sm_max


class UnknownToolchain(TrtpipeError):
    """A toolchain name that is not pinned (or is newer than the last supported line)."""

    exit_code = 2


def version_tuple(version: str) -> tuple[int, ...]:
    """'1.2.1' -> (1, 2, 1); stops at the first non-numeric part ('1.2.0rc3' -> (1, 2, 0))."""
    parts: list[int] = []
    for piece in version.split("."):
        match = re.match(r"\d+", piece)
        if not match:
            break
        parts.append(int(match.group()))
        if match.group() != piece:
            break
    return tuple(parts)


def load_toolchains(path: Path | None = None, *, include_preview: bool = False,
                    configs: Path | None = None) -> dict[str, Toolchain]:
    """The pinned stable toolchains by name, oldest first (`include_preview`: the preview lines too), from `path`
    or the toolchains.yaml of `configs` (the build_configs/ folder; None: the shipped one)."""
    path = path or configs_dir(configs) / "toolchains.yaml"
    toolchains = {t.name: t for t in load_table(path, "toolchain table", "toolchains", Toolchain)
                  if include_preview or t.preview is None}
    return dict(sorted(toolchains.items(), key=lambda item: item[1].version_tuple))


def newest_toolchain(toolchains: dict[str, Toolchain]) -> Toolchain:
    """The newest stable toolchain: a preview line is never a default, only named by a spec that opts in."""
    return max((t for t in toolchains.values() if t.preview is None), key=lambda t: t.version_tuple)


def get_toolchain(name: str | None, *, path: Path | None = None, configs: Path | None = None) -> Toolchain:
    """The pinned toolchain called `name` ("trtllm-1.2.1" or just "1.2.1"); None means the newest stable one.
    A preview line is found by its full name only."""
    toolchains = load_toolchains(path, include_preview=True, configs=configs)
    if name is None:
        return newest_toolchain(toolchains)
    wanted = name.strip()
    candidates = (wanted, f"trtllm-{wanted}")
    for candidate in candidates:
        if candidate in toolchains:
            return toolchains[candidate]
    bare = wanted.removeprefix("trtllm-").removeprefix("v")
    # "1.2" names the 1.2 line: accept it when exactly one pinned stable toolchain is on that line (a preview
    # line is chosen only by its full name)
    on_line = [t for t in toolchains.values() if t.trtllm_version.startswith(bare + ".") and t.preview is None]
    if len(on_line) == 1:
        return on_line[0]
    numbers = version_tuple(bare)
    if len(numbers) >= 2 and numbers[:2] > LAST_SUPPORTED_LINE:
        previews = [t.name for t in toolchains.values() if t.preview is not None]
        also = (f"; the LLM-API backend can be trialled on the preview line {' or '.join(previews)} "
                "(backend: llm-api, allow_preview: true)") if previews else ""
        raise UnknownToolchain(
            f"toolchain {name!r} is not pinned: {REMOVAL_REASON}{also}",
            fix=f"use one of: {', '.join(toolchains)}",
        )
    close = difflib.get_close_matches(wanted, list(toolchains), n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise UnknownToolchain(
        f"unknown toolchain {name!r}",
        fix=f"{hint}pinned toolchains: {', '.join(toolchains)} (build_configs/toolchains.yaml)",
    )
