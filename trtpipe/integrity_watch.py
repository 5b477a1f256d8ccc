"""What the store found damaged during a run, each finding told once: a stored object that did not hold its
digest's bytes (moved to quarantine), an entry that failed verification (quarantined). The runner shows them
as warnings and keeps them in the line of the stage that ran into them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trtpipe.store.local import Store


class IntegrityWatch:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._seen_corrupt = 0
        self._seen_quarantined = 0

    def new_findings(self) -> list[str]:
        """What the store found corrupt (and set aside) since the last call."""
        found = [f"stored object sha256:{digest[:12]} did not hold its digest's bytes (moved to quarantine)"
                 for digest in self.store.objects.corrupt[self._seen_corrupt:]]
        found += [f"{kind} {key[:16]} failed verification ({problems[0].file}: {problems[0].reason}; quarantined)"
                  for kind, key, _, problems in self.store.quarantined[self._seen_quarantined:]]
        self._seen_corrupt = len(self.store.objects.corrupt)
        self._seen_quarantined = len(self.store.quarantined)
        return found


__all__ = ["IntegrityWatch"]
