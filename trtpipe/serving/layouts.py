"""Repository layouts: the kinds of Triton model repository trtpipe publishes, one registry entry each.

A layout owns where its templates live under triton_repo/, how a repository of it is recognised when its
manifest predates the `layout` field, how it is validated, and how its Triton container runs: which
tritonserver processes, and which models each one loads. (Its request contract, how clients talk to the model
it serves, is `trtpipe.serving.client.REQUEST_CONTRACTS`, keyed by the same names.) Code outside a layout's own
modules looks its layout up here, from the manifest, and calls what it finds; it does not compare names.

- inflight_batcher_llm: upstream's ensemble, preprocessing, tensorrt_llm, postprocessing and tensorrt_llm_bls
  (trtpipe.serving.publish); on a GPU one tritonserver per rank under mpirun, rank 0 serving the models the
  manifest names and the others only the engine.
- llmapi: TensorRT-LLM's llmapi `tensorrt_llm` model (trtpipe.serving.llmapi); one tritonserver under
  `mpirun -n 1` whatever the world size: the LLM starts its own workers (trtpipe.serving.server docker_command).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

INFLIGHT_BATCHER_LLM = "inflight_batcher_llm"
LLMAPI = "llmapi"


@dataclass(frozen=True)
class RepositoryLayout:
    name: str
    # Its templates' folder under triton_repo/ ("" for the root, whose digest skips the other layouts' folders),
    # and the model whose config.pbtxt shows the templates are there.
    template_subdir: str
    first_model: str
    # Per tritonserver process of its container, the models that process loads: (repository, manifest,
    # the models the manifest names, the world size) -> one list per process.
    server_models: Callable[[Path, dict[str, Any], list[str], int], list[list[str]]]
    # Whether its container runs tritonserver under mpirun even as a single process.
    always_mpirun: bool
    # Recognised by its files (a manifest without `layout`).
    looks_like: Callable[[Path], bool]
    # Its checks, on a trtpipe.serving.validate checker whose manifest is loaded.
    validate: Callable[[Any], None]


def _inflight_servers(repo: Path, manifest: dict[str, Any], models: list[str], world: int) -> list[list[str]]:
    return [models, *(["tensorrt_llm"] for _ in range(world - 1))]


def _llmapi_servers(repo: Path, manifest: dict[str, Any], models: list[str], world: int) -> list[list[str]]:
    """Upstream's launch for this layout (tensorrtllm_backend 98bfe1d docs/llmapi.md: launch_triton_server.py
    --model_repo=llmapi_repo/, world size left at its default 1) runs ONE tritonserver under `mpirun -n 1`
    (TensorRT-LLM triton_backend/scripts/launch_triton_server.py get_cmd, code index 0a2e2c1f); with an MPI
    world of one, upstream's model.py starts the LLM, which spawns its own tensor/pipeline-parallel workers."""
    return [models]


def _looks_like_llmapi(repo: Path) -> bool:
    return (repo / "tensorrt_llm" / "1" / "model.yaml").is_file() and not (repo / "ensemble").exists()


def _validate_inflight(checker: Any) -> None:
    from trtpipe.serving.validate import check_inflight_batcher

    check_inflight_batcher(checker)


def _validate_llmapi(checker: Any) -> None:
    from trtpipe.serving.llmapi_validate import check_llmapi

    check_llmapi(checker)


LAYOUTS: dict[str, RepositoryLayout] = {
    INFLIGHT_BATCHER_LLM: RepositoryLayout(
        name=INFLIGHT_BATCHER_LLM, template_subdir="", first_model="ensemble", server_models=_inflight_servers,
        always_mpirun=False, looks_like=lambda repo: True, validate=_validate_inflight),
    LLMAPI: RepositoryLayout(
        name=LLMAPI, template_subdir="llmapi", first_model="tensorrt_llm", server_models=_llmapi_servers,
        always_mpirun=True, looks_like=_looks_like_llmapi, validate=_validate_llmapi),
}
DEFAULT_LAYOUT = INFLIGHT_BATCHER_LLM


def layout_of(repo: Path, manifest: dict[str, Any] | None) -> RepositoryLayout:
    """The layout a repository has: said by its manifest, else recognised by its files (the default layout when
    a manifest names none trtpipe knows: its checks then say what is missing)."""
    if manifest is not None and "layout" in manifest:
        return LAYOUTS.get(str(manifest.get("layout")), LAYOUTS[DEFAULT_LAYOUT])
    for layout in LAYOUTS.values():
        if layout.name != DEFAULT_LAYOUT and layout.looks_like(Path(repo)):
            return layout
    return LAYOUTS[DEFAULT_LAYOUT]
