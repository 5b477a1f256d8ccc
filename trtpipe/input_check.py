"""A stored input verified before a stage builds on it, at most once per run: a flipped byte in an input would
carry over into everything built on it.

Verified means committed or checked in this run, or every file's sha256 matching its manifest by the digest
cache's rules (a file unchanged since it was hashed is not read again). An entry that fails is quarantined and
said; the runner (trtpipe.runner) then rebuilds it from its own inputs, verified the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trtpipe.store.local import Entry, Store


class InputCheck:
    def __init__(self, store: Store, note: Callable[..., None]) -> None:
        self.store = store
        self.note = note
        self.verified: set[tuple[str, str]] = set()  # (kind, key) whose bytes this run hashed or checked

    def mark(self, kind: str, key: str) -> None:
        """The entry of `key` was hashed or verified in this run."""
        self.verified.add((kind, key))

    def holds(self, name: str, entry: Entry) -> bool:
        """Whether stage `name`'s entry holds the bytes its manifest names; one that does not is quarantined."""
        if (entry.kind, entry.key) in self.verified:
            return True
        problems = self.store.verify_entry(entry)
        if not problems:
            self.mark(entry.kind, entry.key)
            return True
        self.store.quarantine(entry, problems)
        self.note(f"  {name:<11} stored {entry.kind} {entry.key[:16]} failed verification ({problems[0].file}: "
                  f"{problems[0].reason}); moved to quarantine, rebuilding it from its inputs", style="yellow")
        return False


__all__ = ["InputCheck"]
