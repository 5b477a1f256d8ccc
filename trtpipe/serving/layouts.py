"""Repository layouts: the kinds of Triton model repository trtpipe publishes, one registry entry each.

A layout owns its writer (the publish stage calls it), where its templates live under triton_repo/, what its
repository key adds, how a repository of it is recognised when its manifest predates the `layout` field (or when
bench is handed a folder), how it is validated, where the tokenizer its served model counts with sits and whether
the server can count prompts for bench, and how its Triton container runs: which tritonserver processes, and which
models each one loads. (Its request contract, how clients talk to the model it serves, and the request patterns
of upstream's clients for it, are `trtpipe.serving.client.REQUEST_CONTRACTS`, keyed by the same names.) Code
outside a layout's own modules looks its layout up here, from the manifest, and calls what it finds; it does not
compare names. Each layout also says which of its files hold weights (`weight_files`): the store's size rule
(trtpipe.store.manifest) is handed it with every stage's through trtpipe.stages.weight_file_rule.

- inflight_batcher_llm: upstream's ensemble, preprocessing, tensorrt_llm, postprocessing and tensorrt_llm_bls
  (trtpipe.serving.inflight_repository); on a GPU one tritonserver per rank under mpirun, rank 0 serving the models the
  manifest names and the others only the engine.
- llmapi: TensorRT-LLM's llmapi `tensorrt_llm` model (trtpipe.serving.llmapi_repository); one tritonserver under
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
    # and a file in it that shows the templates are there (an installation without them is one line, not a
    # traceback when the writer first reads one).
    template_subdir: str
    template_marker: str
    # Per tritonserver process of its container, the models that process loads: (repository, manifest,
    # the models the manifest names, the world size) -> one list per process.
    server_models: Callable[[Path, dict[str, Any], list[str], int], list[list[str]]]
    # Whether its container runs tritonserver under mpirun even as a single process.
    always_mpirun: bool
    # Recognised by its files (a manifest without `layout`).
    looks_like: Callable[[Path], bool]
    # Its checks, on a trtpipe.serving.validate checker whose manifest is loaded.
    validate: Callable[[Any], None]
    # Its writer: (resolved spec, artifact folder, artifact digest, artifact key, output folder, repository key)
    # -> the validated repository in the output folder (the artifact is the engine, or the LLM-API artifact).
    publish: Callable[[Any, Path, str, str | None, Path, str | None], Path]
    # What its repository key's `serving` document holds beside the spec's triton section (the default layout
    # adds nothing, so its keys are what they were before there were layouts).
    key_serving: dict[str, str]
    # The tokenizer.json its served model tokenizes with, and that model's add_special_tokens (None: the
    # tokenizer's default), for a repository of this layout: (repository, the option that named it).
    served_tokenizer: Callable[[Path, str], tuple[Path, bool | None]]
    # The served model that counts a prompt's tokens for bench's server check (its REQUEST_INPUT_LEN), or None
    # and `uncounted` saying why the prompt lengths cannot be checked by the server.
    counting_model: str | None
    uncounted: str | None
    # Which of its files hold weights (a regex over the repository-relative path, where its writer puts the
    # artifact's weight files): those may be as large as one GPU's share of a model (trtpipe.store.manifest).
    weight_files: str


def _inflight_servers(repo: Path, manifest: dict[str, Any], models: list[str], world: int) -> list[list[str]]:
    return [models, *(["tensorrt_llm"] for _ in range(world - 1))]


def _llmapi_servers(repo: Path, manifest: dict[str, Any], models: list[str], world: int) -> list[list[str]]:
    """Upstream's launch for this layout (tensorrtllm_backend 98bfe1d docs/llmapi.md: launch_triton_server.py
    --model_repo=llmapi_repo/, world size left at its default 1) runs ONE tritonserver under `mpirun -n 1`
    (TensorRT-LLM triton_backend/scripts/launch_triton_server.py get_cmd, code index 0a2e2c1f); with an MPI
    world of one, upstream's model.py starts the LLM, which spawns its own tensor/pipeline-parallel workers."""
    return [models]


def _looks_like_inflight(repo: Path) -> bool:
    return (repo / "preprocessing" / "config.pbtxt").is_file()


def _looks_like_llmapi(repo: Path) -> bool:
    return ((repo / "tensorrt_llm" / "1" / "model.yaml").is_file() and not (repo / "ensemble").exists()
            and not (repo / "preprocessing").exists())


def _validate_inflight(checker: Any) -> None:
    from trtpipe.serving.validate import check_inflight_batcher

    check_inflight_batcher(checker)


def _validate_llmapi(checker: Any) -> None:
    from trtpipe.serving.llmapi_validate import check_llmapi

    check_llmapi(checker)


def _publish_inflight(resolved: Any, engine_dir: Path, engine_digest: str, engine_key: str | None, out_dir: Path,
                      repository_key: str | None) -> Path:
    from trtpipe.serving.inflight_repository import publish_repository

    assert engine_key is not None, "an engine repository names its engine's key"
    return publish_repository(resolved, engine_dir, engine_digest, engine_key, out_dir, repository_key=repository_key)


def _publish_llmapi(resolved: Any, artifact_dir: Path, artifact_digest: str, artifact_key: str | None, out_dir: Path,
                    repository_key: str | None) -> Path:
    from trtpipe.serving.llmapi_repository import publish_llmapi_repository

    return publish_llmapi_repository(resolved, artifact_dir, artifact_digest, out_dir, repository_key=repository_key)


def _inflight_tokenizer(repo: Path, option: str) -> tuple[Path, bool | None]:
    from trtpipe.serving.inflight_repository import served_tokenizer

    return served_tokenizer(repo, option)


def _llmapi_tokenizer(repo: Path, option: str) -> tuple[Path, bool | None]:
    from trtpipe.serving.llmapi_repository import served_tokenizer

    return served_tokenizer(repo, option)


LAYOUTS: dict[str, RepositoryLayout] = {
    INFLIGHT_BATCHER_LLM: RepositoryLayout(
        name=INFLIGHT_BATCHER_LLM, template_subdir="", template_marker="ensemble/config.pbtxt",
        server_models=_inflight_servers,
        always_mpirun=False, looks_like=_looks_like_inflight, validate=_validate_inflight,
        publish=_publish_inflight, key_serving={}, served_tokenizer=_inflight_tokenizer,
        counting_model="preprocessing", uncounted=None,
        weight_files=r"tensorrt_llm/1/rank[0-9]{1,5}\.(?:engine|safetensors)"),
    LLMAPI: RepositoryLayout(
        name=LLMAPI, template_subdir="llmapi", template_marker="tensorrt_llm/config.pbtxt",
        server_models=_llmapi_servers,
        always_mpirun=True, looks_like=_looks_like_llmapi, validate=_validate_llmapi,
        publish=_publish_llmapi, key_serving={"layout": LLMAPI}, served_tokenizer=_llmapi_tokenizer,
        counting_model=None,
        uncounted="the llmapi model counts no tokens over gRPC (it returns text only); prompt lengths are counted "
                  "with the tokenizer of the checkpoint it serves",
        weight_files=r"tensorrt_llm/1/checkpoint/model(?:-[0-9]{5}-of-[0-9]{5})?\.safetensors"),
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


def recognised_layout(folder: Path) -> RepositoryLayout | None:
    """The layout whose files `folder` holds, or None when it is no repository trtpipe publishes."""
    return next((layout for layout in LAYOUTS.values() if layout.looks_like(Path(folder))), None)
