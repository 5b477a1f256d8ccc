"""The trust gate as a build's runner uses it: what to make of a stored entry that came from a registry.

The release area's trust policy provides the judge (`PulledCheck`; the runner imports nothing of it). Without
one, a pulled entry is used and the build says that no policy checked it; an entry built here needs no word.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trtpipe.store.local import Entry, Store

# Judges an entry that came from a registry: (usable, note). Unusable: the stage is rebuilt here instead.
PulledCheck = Callable[["Entry"], tuple[bool, str]]


@dataclass(frozen=True)
class PulledTrust:
    store: Store
    check: PulledCheck | None = None  # the trust policy's judge, or None: no policy

    def judge_reused(self, entry: Entry) -> tuple[bool, str | None]:
        """(usable, what to say) for a stored entry about to be reused: judged by the policy when there is one."""
        if self.check is not None:
            usable, note = self.check(entry)
            return usable, note or None
        return True, self.unchecked_note(entry)

    def note_pulled(self, entry: Entry) -> str | None:
        """What to say of an entry just pulled: under a policy, nothing (the pull's gate judged it)."""
        return None if self.check is not None else self.unchecked_note(entry)

    def unchecked_note(self, entry: Entry) -> str | None:
        """What to say about using a pulled entry when no trust policy judges it (None: it was built here)."""
        from trtpipe.store import signatures

        record = signatures.read_record(self.store.root, entry.digest)
        if record is None or not record.get("pulled_from"):
            return None
        if not record["bundles"]:
            return f"using an unsigned pulled entry (from {record['pulled_from']}); no trust policy checks it"
        # Which key signed it is not known without a key to verify against (the key id is the pusher's claim).
        return (f"using a pulled entry carrying a signature (from {record['pulled_from']}), not verified: "
                "no trust policy")


__all__ = ["PulledCheck", "PulledTrust"]
