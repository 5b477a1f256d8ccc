"""The engine stage for an engine built outside trtpipe: `trtpipe publish SPEC --engine DIR` stores it like a built
one (content-digested, immutable) and the publish stage (trtpipe.stages.publish) writes its repository as usual.

Key document (`imported_engine_key`): the origin ("imported") and every engine file's name and sha256, nothing
else: no path, no time, no host. The same bytes imported from any folder, on any machine, on any day are one
entry with one digest, and so one repository. Where the files came from is the build record's (the stage's
facts: `imported_from`), never the key's. The engine's fit with the spec is checked before it is keyed
(trtpipe.engine.imported), so a misfit leaves nothing in the store.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from trtpipe.errors import IntegrityError
from trtpipe.stages.base import InputRef, Preview, StageContext
from trtpipe.stages.engine import ENGINE_WEIGHT_FILES
from trtpipe.store.keys import StageKey, make_key

ORIGIN = "imported"
_BLOCK = 8 * 1024 * 1024


def imported_engine_key(files: dict[str, str]) -> StageKey:
    """Key of an imported engine: {name: sha256 hex} of its files, and its origin."""
    return make_key("engine", {"origin": ORIGIN, "files": dict(sorted(files.items()))})


def copy_hashing(src: Path, dst: Path) -> str:
    """Copy `src` to the new file `dst`, hashing the bytes as they are written (read once): the sha256 hex.
    A copy, never a link: the store makes its files read-only, and a link would make the user's file so."""
    digest = hashlib.sha256()
    with open(src, "rb") as fin, open(dst, "xb") as fout:
        while block := fin.read(_BLOCK):
            digest.update(block)
            fout.write(block)
        fout.flush()
        os.fsync(fout.fileno())
    return digest.hexdigest()


class ImportedEngineStage:
    """Import the engine folder `engine_dir` as the engine artifact, after checking it against the spec."""

    name = "engine"
    kind = "engine"
    inputs: tuple[str, ...] = ()
    weight_files = ENGINE_WEIGHT_FILES
    built_outcome = "imported"  # what the runner reports for a stage it ran (a build record says "imported")

    def __init__(self, engine_dir: Path) -> None:
        self.engine_dir = Path(engine_dir).resolve()
        self._checked: Any = None  # trtpipe.engine.imported.OutsideEngine, once checked in this run

    def checked(self, ctx: StageContext) -> Any:
        if self._checked is None:
            from trtpipe.engine.imported import check_outside_engine

            self._checked = check_outside_engine(self.engine_dir, ctx.resolved, ctx.build_plan)
        return self._checked

    def key(self, ctx: StageContext, inputs: dict[str, InputRef]) -> StageKey:
        outside = self.checked(ctx)
        # Through the digest cache: an engine imported before and unchanged since is not read again to be keyed.
        return imported_engine_key({name: ctx.digests.digest(self.engine_dir / name) for name in outside.files})

    def build(self, ctx: StageContext, out_dir: Path, inputs: dict[str, InputRef], key: StageKey) -> dict[str, Any]:
        outside = self.checked(ctx)
        expected: dict[str, str] = key.inputs["files"]
        for name in outside.files:
            target = Path(out_dir) / name
            sha256 = copy_hashing(self.engine_dir / name, target)
            if sha256 != expected[name]:
                raise IntegrityError(
                    f"{self.engine_dir / name} changed while it was imported (sha256:{expected[name][:12]}... when "
                    f"keyed, sha256:{sha256[:12]}... when copied); nothing was stored",
                    path=str(self.engine_dir / name), fix="wait until whatever writes the engine folder is done, then "
                    "publish it again")
            ctx.written[target] = sha256  # hashed as written: the store does not read it again
        return {"origin": ORIGIN, "imported_from": outside.folder, "files": outside.files,
                "left_out": outside.left_out, "notes": outside.notes,
                "engine": {"trtllm_version": outside.trtllm_version, "tp": outside.tp, "pp": outside.pp,
                           "limits": outside.limits}}

    def preview(self, ctx: StageContext, key: str | None, inputs: dict[str, InputRef]) -> Preview | None:
        return None
