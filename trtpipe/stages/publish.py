"""The publish stage: engine -> Triton model repository (the inflight_batcher_llm layout), keyed by the
engine's bytes and what the repository is released as.

Key document (`repository_key`): the engine's DIGEST (not its key: a repository is a function of the
engine's bytes, so a rebuilt engine with other bytes publishes a new repository and one with the same
bytes reuses it), the serving options, the tokenizer files' digest, the serving templates' digest, the
trtpipe version, and the artifact's name, target, toolchain, quantization and release gates (promote
reads them from the repository, so two specs that differ only there get two repositories).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import trtpipe
from trtpipe.model_folder import TOKENIZER_FILES
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
    """Write the inflight_batcher_llm repository for the engine (the reference backend's tensorrt_llm model
    is the CPU runtime behind the same contract)."""

    name = "publish"
    kind = "repository"
    inputs = ("engine",)

    def key(self, ctx: StageContext, inputs: dict[str, InputRef]) -> StageKey:
        engine_digest = inputs["engine"].digest
        if engine_digest is None:
            raise NoKey("key follows the engine's digest, known once the engine is built")
        resolved = ctx.resolved
        spec = resolved.spec
        return repository_key(
            engine_digest=engine_digest,
            serving=spec.triton.model_dump(mode="json"),
            tokenizer_digest=tokenizer_digest(ctx.digests, resolved.tokenizer_dir),
            templates_digest=templates_digest(),
            trtpipe_version=trtpipe.__version__,
            name=spec.artifact_name,
            target={"gpu": spec.target.gpu, "sm": resolved.sm, "tp": spec.target.tp, "pp": spec.target.pp},
            toolchain=resolved.toolchain.name,
            quant=spec.quantization.algo,
            release=spec.release.model_dump(mode="json"),
        )

    def build(self, ctx: StageContext, out_dir: Path, inputs: dict[str, InputRef], key: StageKey) -> dict[str, Any]:
        from trtpipe.serving.publish import publish_repository

        engine = inputs["engine"]
        assert engine.key is not None and engine.digest is not None
        publish_repository(ctx.resolved, engine.path, engine.digest, engine.key, out_dir, repository_key=key.key)
        return {}

    def preview(self, ctx: StageContext, key: str | None, inputs: dict[str, InputRef]) -> Preview | None:
        return None
