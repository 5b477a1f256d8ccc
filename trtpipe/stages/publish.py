"""The publish stage: the backend's artifact (an engine, or the LLM-API artifact) -> a Triton model repository in
the backend's layout (trtpipe.serving.layouts: the layout's writer), keyed by the artifact's bytes and what the
repository is released as.

Key document (`repository_key`): the artifact's DIGEST (not its key: a repository is a function of the
artifact's bytes, so a rebuilt engine with other bytes publishes a new repository and one with the same
bytes reuses it), the serving options with what the layout adds to them, the tokenizer files' digest, the
layout's templates digest (its files under triton_repo/: a change to one layout's templates never republishes
another's), the trtpipe version, and the artifact's name, target, toolchain, quantization and release gates
(promote reads them from the repository, so two specs that differ only there get two repositories).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import trtpipe
from trtpipe.model_folder import TOKENIZER_FILES
from trtpipe.serving.layouts import RepositoryLayout
from trtpipe.serving.templates import templates_digest
from trtpipe.stages.base import InputRef, NoKey, Preview, StageContext
from trtpipe.store.digest_cache import DigestCache
from trtpipe.store.keys import StageKey, make_key, tree_digest


def repository_key(
    *,
    engine_digest: str,
    serving: Mapping[str, Any],
    tokenizer_digest: str | None,
    templates_digest: str,
    trtpipe_version: str,
    name: str,
    target: Mapping[str, Any],
    toolchain: str,
    quant: str,
    release: Mapping[str, Any],
) -> StageKey:
    """Key of a Triton model repository (see the module doc). `templates_digest` covers the config.pbtxt
    templates and model.py files the repository is rendered from: editing one republishes even when the
    trtpipe version string did not move."""
    if not engine_digest.startswith("sha256:"):
        raise ValueError(f"engine_digest {engine_digest!r} is not an artifact digest (sha256:...)")
    return make_key("repository", {
        "engine": {"digest": engine_digest},
        "serving": dict(serving),
        "tokenizer": tokenizer_digest,
        "templates": templates_digest,
        "trtpipe_version": trtpipe_version,
        "name": name,
        "target": dict(target),
        "toolchain": toolchain,
        "quant": quant,
        "release": dict(release),
    })


def tokenizer_digest(digests: DigestCache, tokenizer_dir: Path | None) -> str | None:
    """One digest of exactly the tokenizer files a published repository carries."""
    if tokenizer_dir is None:
        return None
    found = {n: digests.digest(Path(tokenizer_dir) / n) for n in TOKENIZER_FILES if (Path(tokenizer_dir) / n).is_file()}
    return tree_digest(found) if found else None


class PublishStage:
    """Write the repository of `layout` for the artifact of the stage `reads` (on cpu-reference the served
    model is the reference runtime behind the same contract)."""

    name = "publish"
    kind = "repository"
    serves = True  # its entry is the repository a server serves (the build reports its path)

    def __init__(self, layout: RepositoryLayout, *, reads: str) -> None:
        self.layout = layout
        self.reads = reads
        self.inputs = (reads,)
        self.weight_files = layout.weight_files

    def key(self, ctx: StageContext, inputs: dict[str, InputRef]) -> StageKey:
        artifact_digest = inputs[self.reads].digest
        if artifact_digest is None:
            raise NoKey(f"key follows the {self.reads}'s digest, known once the {self.reads} is built")
        resolved = ctx.resolved
        spec = resolved.spec
        return repository_key(
            engine_digest=artifact_digest,
            serving={**spec.serving_settings(), **self.layout.key_serving},
            tokenizer_digest=tokenizer_digest(ctx.digests, resolved.tokenizer_dir),
            templates_digest=templates_digest(layout=self.layout.name),
            trtpipe_version=trtpipe.__version__,
            name=spec.artifact_name,
            target={"gpu": spec.target.gpu, "sm": resolved.sm, "tp": spec.target.tp, "pp": spec.target.pp},
            toolchain=resolved.toolchain.name,
            quant=spec.quantization.algo,
            release=spec.release.model_dump(mode="json"),
        )

    def build(self, ctx: StageContext, out_dir: Path, inputs: dict[str, InputRef], key: StageKey) -> dict[str, Any]:
        artifact = inputs[self.reads]
        assert artifact.digest is not None
        self.layout.publish(ctx.resolved, artifact.path, artifact.digest, artifact.key, out_dir, key.key)
        return {}

    def preview(self, ctx: StageContext, key: str | None, inputs: dict[str, InputRef]) -> Preview | None:
        return None
