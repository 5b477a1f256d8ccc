"""Garbage collection: stale build leftovers, quarantined and trashed entries, unreferenced
objects, and (LRU) entries beyond a size or age limit.

Never removed: an entry whose digest a channel pins, an entry a running build holds (build lock
or lease), a build in progress, a live server's serving directory, and a quarantined entry a channel
pins while no healthy entry of that digest is back (it is what `cache verify --repair` restores).
Entries in an older manifest format are removed (unless pinned): the next build rebuilds them.

An entry whose manifest.json is damaged (does not parse, wrong types: its digest is unknowable) is
quarantined like any corrupt entry, and its quarantined copy is kept while any pinned digest has no
intact entry in the store: it may be that artifact, and it is what a repair can start from.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from pydantic import BaseModel

from trtpipe.errors import UsageError
from trtpipe.store.local import KINDS, MANIFEST, Entry, Problem, Store

_SIZE_UNITS = {
    "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
}  # fmt: skip
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
# Leftovers of unknown shape (not named kind-key-*) are removed only once they are this old.
_ORPHAN_AGE_S = 24 * 3600


def parse_size(text: str) -> int:
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _SIZE_UNITS | {"": 1}:
        raise UsageError(f"cannot read size {text!r}", fix="write it like 500MB, 10GB or 2GiB")
    return int(float(match.group(1)) * (_SIZE_UNITS.get(match.group(2).lower(), 1)))


def parse_age(text: str) -> float:
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([smhdw])\s*", text)
    if not match:
        raise UsageError(f"cannot read age {text!r}", fix="write it like 30d, 12h, 45m or 2w")
    return float(match.group(1)) * _AGE_UNITS[match.group(2)]


class GcAction(BaseModel):
    what: str  # "entry" | "object" | "tmp" | "quarantine" | "trash"
    name: str
    bytes: int
    reason: str


class GcReport(BaseModel):
    dry_run: bool
    removed: list[GcAction] = []
    kept_pinned: list[str] = []
    kept_in_use: list[str] = []
    quarantined: list[str] = []  # entries with a damaged manifest, moved to quarantine by this run
    kept_maybe_pinned: dict[str, list[str]] = {}  # quarantined, manifest unreadable -> pins it may be
    freed_bytes: int = 0
    entries_bytes_after: int = 0

    def add(self, action: GcAction) -> None:
        self.removed.append(action)
        self.freed_bytes += action.bytes


def _tree_bytes(path) -> int:
    total = 0
    for folder, _, names in os.walk(path):
        for name in names:
            try:
                st = os.lstat(os.path.join(folder, name))
            except FileNotFoundError:
                continue
            if st.st_nlink <= 1:
                total += st.st_size
    return total


class _InodeBook:
    """Bytes held by entries, counting each shared (hard-linked) file once."""

    def __init__(self) -> None:
        self.refs: dict[tuple[int, int], int] = {}
        self.sizes: dict[tuple[int, int], int] = {}
        self.by_entry: dict[str, list[tuple[int, int]]] = {}
        self.total = 0

    def add(self, entry: Entry) -> None:
        inodes = []
        for item in entry.files:
            try:
                st = (entry.path / item["path"]).stat()
            except FileNotFoundError:
                continue
            ident = (st.st_dev, st.st_ino)
            inodes.append(ident)
            if self.refs.get(ident, 0) == 0:
                self.sizes[ident] = st.st_size
                self.total += st.st_size
            self.refs[ident] = self.refs.get(ident, 0) + 1
        self.by_entry[f"{entry.kind}/{entry.key}"] = inodes

    def drop(self, entry: Entry) -> int:
        freed = 0
        for ident in self.by_entry.pop(f"{entry.kind}/{entry.key}", []):
            self.refs[ident] -= 1
            if self.refs[ident] == 0:
                freed += self.sizes[ident]
        self.total -= freed
        return freed


def collect(
    store: Store, *, pins: dict[str, list[str]], max_size: int | None = None, max_age_s: float | None = None,
    dry_run: bool = False,
) -> GcReport:
    """Collect garbage. `pins`: each digest a channel pins (or can roll back to) -> the channels naming
    it, from the release area (`trtpipe.release.channels.ChannelStore.pins`): the store reads no channel."""
    report = GcReport(dry_run=dry_run)
    now = time.time()
    listed = list(store.entries())
    for entry in listed:
        if entry.damage is not None:  # its digest is unknowable: set aside like any corrupt entry, never read
            if not dry_run:
                store.quarantine(entry, [Problem(entry.kind, entry.key, MANIFEST, entry.damage)])
            report.quarantined.append(f"{entry.kind}/{entry.key} ({MANIFEST}: {entry.damage})")
    _clean_leftovers(store, report, now, dry_run, pins)

    pinned = set(pins)
    # least recently used first
    entries = sorted((e for e in listed if e.damage is None), key=lambda e: e.last_used)
    book = _InodeBook()
    for entry in entries:
        book.add(entry)

    def removable(entry: Entry) -> bool:
        name = f"{entry.kind}/{entry.key}"
        if entry.digest in pinned:
            if name not in report.kept_pinned:
                report.kept_pinned.append(name)
            return False
        if not store.locks.is_free(entry.kind, entry.key):
            if name not in report.kept_in_use:
                report.kept_in_use.append(name)
            return False
        return True

    def drop(entry: Entry, reason: str) -> None:
        freed = book.drop(entry)
        if not dry_run and not store.remove(entry):
            report.kept_in_use.append(f"{entry.kind}/{entry.key}")
            return
        report.add(GcAction(what="entry", name=f"{entry.kind}/{entry.key}", bytes=freed, reason=reason))

    remaining: list[Entry] = []
    for entry in entries:
        age = now - entry.last_used
        if entry.outdated and removable(entry):
            drop(entry, f"written by an older trtpipe (manifest version {entry.manifest.get('manifest_version')}); "
                        "the next build rebuilds it")
        elif max_age_s is not None and age > max_age_s and removable(entry):
            drop(entry, f"unused for {age / 86400:.1f} days")
        else:
            remaining.append(entry)
    if max_size is not None:
        for entry in remaining:
            if book.total <= max_size:
                break
            if removable(entry):
                drop(entry, f"store over {max_size} bytes (least recently used)")
    report.entries_bytes_after = book.total

    # Objects linked from nowhere else (link count 1) belong to no entry and no running build.
    for digest, path in list(store.objects.iter_objects()):
        try:
            st = path.stat()
        except FileNotFoundError:
            continue
        if st.st_nlink <= 1:
            if not dry_run:
                path.unlink(missing_ok=True)
            report.add(GcAction(what="object", name=digest, bytes=st.st_size, reason="referenced by no entry"))
    return report


def _clean_leftovers(store: Store, report: GcReport, now: float, dry_run: bool, pins: dict[str, list[str]]) -> None:
    tmp = store.root / "tmp"
    if tmp.is_dir():
        for child in sorted(tmp.iterdir()):
            parts = child.name.lstrip(".").split("-", 2)
            if len(parts) == 3 and parts[0] in KINDS:
                stale = store.locks.is_free(parts[0], parts[1])  # no live builder holds this key
            else:
                stale = now - child.stat().st_mtime > _ORPHAN_AGE_S
            if stale:
                size = _tree_bytes(child)
                if not dry_run:
                    store.discard_tree(child)
                report.add(GcAction(what="tmp", name=child.name, bytes=size, reason="leftover of an interrupted build"))
    # A quarantined entry a channel pins stays until a healthy entry of its digest is back; one whose
    # manifest is unreadable (its digest unknowable) stays while any pin has no intact entry here.
    keep: set[str] = set()
    unaccounted: dict[str, list[str]] | None = None
    for item in store.quarantined_entries():
        path = Path(item["path"])
        if item["digest"] in pins and store.healthy(item["kind"], item["key"], item["digest"]) is None:
            keep.update({path.name, f"{path.name}.reason.json"})
            report.kept_pinned.append(f"quarantine/{path.name}")
        elif any(p.get("file") == MANIFEST for p in item["problems"] if isinstance(p, dict)):
            if unaccounted is None:
                intact = {e.digest for e in store.entries() if e.current and not store.check(e, digests=False)}
                unaccounted = {d: c for d, c in pins.items() if d not in intact}
            if unaccounted:
                keep.update({path.name, f"{path.name}.reason.json"})
                report.kept_maybe_pinned[f"quarantine/{path.name}"] = sorted(
                    f"{channel} ({digest})" for digest, channels in unaccounted.items() for channel in channels)
    for folder in ("quarantine", "trash"):
        base = store.root / folder
        if not base.is_dir():
            continue
        for child in sorted(base.iterdir()):
            if folder == "quarantine" and child.name in keep:
                continue
            size = _tree_bytes(child) if child.is_dir() else child.stat().st_size
            if not dry_run:
                store.discard_tree(child)
            report.add(GcAction(what=folder, name=child.name, bytes=size, reason="quarantined (corrupt)" if folder == "quarantine" else "deleted entry"))
    _clean_serving_dirs(store, report, dry_run)
    # Stray staging files of objects (a process killed between link and rename).
    for stray in (store.root / "objects" / "sha256").glob("*/.tmp-*"):
        if now - stray.stat().st_mtime > 3600:
            if not dry_run:
                stray.unlink(missing_ok=True)
            report.add(GcAction(what="tmp", name=stray.name, bytes=0, reason="stray object staging file"))


def _clean_serving_dirs(store: Store, report: GcReport, dry_run: bool) -> None:
    """Serving directories of servers that are gone (their owner's lock is free)."""
    from trtpipe.store.serving_dirs import LOCK_SUFFIX, stale_serving_dirs

    for path in stale_serving_dirs(store.root):
        size = _tree_bytes(path) if path.is_dir() else 0
        if not dry_run:
            store.discard_tree(path)
            if not path.name.endswith(LOCK_SUFFIX):
                path.with_name(path.name + LOCK_SUFFIX).unlink(missing_ok=True)
        report.add(GcAction(what="serving", name=path.name, bytes=size, reason="serving directory of a stopped server"))
