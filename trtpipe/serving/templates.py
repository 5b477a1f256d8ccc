"""config.pbtxt templates in `triton_repo/` and their strict rendering.

Every `${name}` in a template must be given a value; a template rendered with a value missing,
or text that still holds `${...}` after rendering, is an error (Triton would load it and fail late).
"""

from __future__ import annotations

import re
from pathlib import Path

from trtpipe.errors import InternalError, MissingCapability
from trtpipe.serving.layouts import DEFAULT_LAYOUT, LAYOUTS, RepositoryLayout
from trtpipe.shipped import triton_repo_dir

# The shipped triton_repo/ (trtpipe.shipped: inside the package in a wheel, beside it in a checkout). A module
# constant so a test can point it at a copy.
TEMPLATE_ROOT = triton_repo_dir()

PLACEHOLDER = re.compile(r"\$\{([^}]*)\}")

MODEL_NAMES = ("ensemble", "preprocessing", "tensorrt_llm", "postprocessing", "tensorrt_llm_bls")
# Beside the rendered models, every published repository (either layout) holds its manifest, and an
# inflight_batcher repository its engine in the tensorrt_llm model's version folder.
MANIFEST_NAME = "trtpipe.json"
ENGINE_SUBDIR = "tensorrt_llm/1"

# The template folder each published model comes from, per target kind.
GPU_SOURCES = {name: name for name in MODEL_NAMES}
REFERENCE_SOURCES = {**GPU_SOURCES, "tensorrt_llm": "tensorrt_llm_reference"}

# The llm-api backend's layout lives in triton_repo/llmapi/: one config.pbtxt (tensorrt_llm/) shared by both
# targets, and the model.py per target kind (its folder under llmapi/).
LLMAPI_SOURCES = {"gpu": "tensorrt_llm", "reference": "tensorrt_llm_reference"}


def _layout(name: str) -> RepositoryLayout:
    if name not in LAYOUTS:
        raise InternalError(f"unknown repository layout {name!r}", fix=f"use one of {', '.join(LAYOUTS)}")
    return LAYOUTS[name]


def template_root(layout: str = DEFAULT_LAYOUT) -> Path:
    """The folder holding `layout`'s templates (trtpipe.serving.layouts: inflight_batcher_llm triton_repo/,
    llmapi triton_repo/llmapi/)."""
    found = _layout(layout)
    root = TEMPLATE_ROOT / found.template_subdir if found.template_subdir else TEMPLATE_ROOT
    if not (root / found.template_marker).is_file():
        raise MissingCapability(
            f"Triton templates not found under {root}",
            fix="reinstall trtpipe (its wheel carries triton_repo/), or restore triton_repo/ in the checkout from git",
        )
    return root


def placeholders(text: str) -> list[str]:
    """The `${...}` names in `text`, in order of first appearance."""
    seen: dict[str, None] = {}
    for match in PLACEHOLDER.finditer(text):
        seen.setdefault(match.group(1), None)
    return list(seen)


def render(text: str, values: dict[str, str], *, source: str) -> str:
    """Fill every `${name}` from `values`; refuse a missing value or a leftover placeholder."""
    missing = [name for name in placeholders(text) if name not in values]
    if missing:
        raise InternalError(
            f"{source}: template variables without a value: {', '.join(missing)}",
            fix="give publish a value for each (trtpipe.serving.inflight_repository.template_values)",
        )
    rendered = PLACEHOLDER.sub(lambda m: values[m.group(1)], text)
    left = placeholders(rendered)
    if left:
        raise InternalError(
            f"{source}: a value itself contains a template variable: {', '.join(left)}",
            fix="values must be literal text",
        )
    return rendered


def templates_digest(root: Path | None = None, *, layout: str = DEFAULT_LAYOUT) -> str:
    """sha256 over every template and model.py of `layout` under triton_repo/ (or `root`): path and bytes, sorted.

    What a published repository is made of besides the engine, spec and tokenizer: the store's
    repository key includes it, so a changed template or model.py republishes. Each layout covers only its
    own files (the inflight_batcher_llm digest skips llmapi/), so a change to one never republishes the other.
    """
    import hashlib

    own = _layout(layout).template_subdir
    if root is None:
        root = template_root(layout)
    elif own:
        root = root / own
    # The root layout's digest skips the folders of the layouts that live below it.
    skip = () if own else tuple(other.template_subdir for other in LAYOUTS.values() if other.template_subdir)
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                       and p.relative_to(root).parts[0] not in skip):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return "sha256:" + digest.hexdigest()
