"""The leases a run holds on the stage keys it looks at or builds, from the first look until the run ends.

While a key is leased, gc (trtpipe.store) removes no entry of it: a build never loses the entry it is about to
reuse or build on. `held()` spans the run; `hold(kind, key)` adds a key's lease to it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trtpipe.store.locking import KeyLocks


class Leases:
    def __init__(self, locks: KeyLocks) -> None:
        self.locks = locks  # the store's
        self._stack: contextlib.ExitStack | None = None

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Every lease taken inside the block is released when it ends, however it ends."""
        with contextlib.ExitStack() as stack:
            self._stack = stack
            try:
                yield
            finally:
                self._stack = None

    def hold(self, kind: str, key: str) -> None:
        assert self._stack is not None, "a lease is taken inside held()"
        self._stack.enter_context(self.locks.lease(kind, key))


__all__ = ["Leases"]
