"""The remote cache as one build uses it, the way Bazel's remote cache and sccache are used: reached once before
the first stage, asked for each key the local store lacks, handed each entry built here to share (read-write
only), and the entry signed where the build has a signer.

A cache that is away (down, refusing the credentials, too slow) fails the build when the build requires it;
otherwise the build says so once and goes on with the local store alone (`remote` is then None). A remote
entry that is refused (its trust gate's judgement, or a key tag that names no entry of its key) is a miss
that is said, and the stage is built here; the push then moves the key tag to this build's entry.

The runner (trtpipe.runner) owns one per build; this module imports no stage and no remote implementation.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtpipe.build_report import BuildReport
from trtpipe.errors import IntegrityError, InvalidInput, TrtpipeError, Untrusted
from trtpipe.store.remote import RemoteUse, is_unavailable

if TYPE_CHECKING:
    from trtpipe.store.local import Entry

# Signs what a build pushed (remote, what the push left, the entry) and says how, in a few words; the release
# area's `sign_pushed` with the workspace's key is one. The build knows no key: the shell hands it one.
PushSigner = Callable[[Any, Any, "Entry"], str]
# Says one line on the build's terminal (text, style).
Note = Callable[..., None]


def _empty(folder: Path) -> None:
    """Remove what a refused pull left in a build's staging folder (the folder stays)."""
    for child in folder.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


class SharedCache:
    def __init__(self, remote: Any, use: RemoteUse, *, sign_push: PushSigner | None, note: Note,
                 report: BuildReport) -> None:
        self.remote = remote  # a remote cache (probe / find / pull_into / push), or None: none, or away
        self.use = use
        self.sign_push = sign_push  # signs each pushed entry (the workspace's key), or None: pushes are unsigned
        self.note = note
        self.report = report  # where an away cache is recorded (remote_unavailable)

    def reach(self) -> None:
        """Before the first stage: is the cache there, and does it take the credentials? (One short request; a
        required cache that is away fails the build here, before anything is built.)"""
        if self.remote is None:
            return
        try:
            self.remote.probe()
        except TrtpipeError as err:
            if not is_unavailable(err):
                raise
            self._away(err)

    def find(self, name: str, kind: str, key: str) -> str | None:
        """The artifact digest the cache holds under `key` (a dry run's would-pull), or None."""
        if self.remote is None:
            return None
        try:
            found = self.remote.find(kind, key)
        except (IntegrityError, InvalidInput) as refused:  # what the key tag names is no entry of this key
            self.note(f"  {name:<11} {refused.one_line()}; would build it here", style="yellow")
            return None
        except TrtpipeError as err:
            if not is_unavailable(err):
                raise
            self._away(err)
            return None
        return found.artifact_digest if found is not None else None

    def pull_into(self, name: str, handle: Any) -> tuple[Entry | None, str | None]:
        """The entry of the handle's key pulled into its staging folder and stored, or None (a miss, a refused
        entry, or the cache went away mid-build), with what to record of a refused one."""
        assert self.remote is not None
        try:
            return self.remote.pull_into(handle), None
        # The pull's trust gate refused it, or what the key tag names is no entry of this key (a planted or
        # damaged manifest): a miss, said; build it here (the push replaces the tag).
        except (Untrusted, IntegrityError, InvalidInput) as refused:
            self.note(f"  {name:<11} {refused.one_line()}; building it here", style="yellow")
            _empty(Path(handle.dir))
            return None, f"remote entry refused ({refused.message}); built here"
        except TrtpipeError as err:  # the cache went away mid-build: build it here instead
            if not is_unavailable(err):
                raise
            self._away(err)
            _empty(Path(handle.dir))
            return None, None

    def push(self, entry: Entry) -> str:
        """Share an entry built here (read-write only); a failed push is reported, not fatal, unless the cache is
        required and away. What was done, in a few words."""
        if not self.use.pushes:
            return f"not pushed: the remote cache {self.remote} is read-only here"
        remote = self.remote
        try:
            pushed = remote.push(entry)
        except TrtpipeError as err:
            if is_unavailable(err):
                self._away(err)  # raises when the remote is required
            else:
                self.note(f"warning: could not push {entry.kind} to {remote}: {err.one_line()}", style="yellow")
            return f"push to {remote} failed: {err.one_line()}"
        # Under a policy an unsigned entry is never a hit anywhere: sign it here, or the cache is write-only.
        said: list[str] = []
        if self.sign_push is not None:
            try:
                said.append(self.sign_push(remote, pushed, entry))
            except TrtpipeError as err:
                if is_unavailable(err):
                    self._away(err)
                self.note(f"warning: pushed {entry.kind} to {remote} but could not sign it: {err.one_line()}",
                          style="yellow")
                said.append(f"unsigned: signing failed: {err.one_line()}")
        replaced = getattr(pushed, "replaced", None)
        if replaced:
            said.append(f"its key tag named {replaced}, which did not verify here; key tag moved to this entry")
        return f"pushed to {remote}" + (f" ({'; '.join(said)})" if said else "")

    def _away(self, err: TrtpipeError) -> None:
        """The cache is down or refused the credentials. Required: the build fails with that one line. Else:
        say so once and go on with the local store."""
        if self.use.required:
            err.message = f"the build requires its remote cache {self.remote}, and it is away: {err.message}"
            raise err
        note = (f"remote cache {self.remote} is away ({err.one_line()}); building with the local store only "
                "(TRTPIPE_REQUIRE_REMOTE=1 makes this an error)")
        self.note(f"warning: {note}", style="yellow")
        self.report.remote_unavailable = note
        self.remote = None


__all__ = ["PushSigner", "SharedCache"]
