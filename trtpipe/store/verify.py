"""`cache verify`: re-hash every stored file; move corrupt artifacts and objects aside.

A file shared by hard link between an entry and its object is hashed once. A corrupt entry is
quarantined with its manifest (so it stays restorable to exactly its digest); when a channel pins
its digest, the report names the channels and files, and gc keeps the quarantined copy until a
healthy entry of that digest is back (`trtpipe cache verify --repair`, or the next build).
"""

from __future__ import annotations

import os
import stat

from pydantic import BaseModel, Field

from trtpipe.store.local import MANIFEST, Entry, Problem, Store
from trtpipe.store.objects import sha256_file


class VerifyProblem(BaseModel):
    kind: str  # an artifact kind, or "object"
    key: str
    file: str | None = None
    reason: str


class PinnedDamage(BaseModel):
    """A corrupt (or earlier quarantined and not yet restored) entry whose digest a channel pins."""

    kind: str
    key: str
    digest: str
    channels: list[str]  # model/target/channel of every pointer naming the digest
    files: list[str]  # the damaged files (or the reason, when no single file is to blame)
    quarantine: str | None  # where the entry was kept, with its manifest
    restored: bool = False


class VerifyReport(BaseModel):
    entries: int = 0
    objects: int = 0
    bytes_hashed: int = 0
    problems: list[VerifyProblem] = Field(default_factory=list)
    quarantined: list[str] = Field(default_factory=list)
    pinned: list[PinnedDamage] = Field(default_factory=list)
    outdated: list[str] = Field(default_factory=list, description="Entries in an older manifest format: rebuilt by the next build.")

    @property
    def ok(self) -> bool:
        return not self.problems and not any(not p.restored for p in self.pinned)


def recorded_digests(store: Store, kind: str, key: str) -> list[str]:
    """The artifact digests the build records give `kind/key` (newest first): who an entry whose own
    manifest is damaged was, so a repair can restore exactly that digest."""
    from trtpipe.build_record import read_records

    found: list[str] = []
    for record in read_records(store.root):
        for stage in record.stages:
            if stage.key == key and stage.digest and record.artifacts.get(kind) == stage.digest and stage.digest not in found:
                found.append(stage.digest)
    return found


def verify_store(store: Store, *, pins: dict[str, list[str]], ref: str | None = None) -> VerifyReport:
    """Check every entry (or the one `ref` names) and object. `pins`: each digest a channel pins -> the
    channels naming it (the release area's, `trtpipe.release.channels.ChannelStore.pins`)."""
    report = VerifyReport()
    hashed: dict[tuple[int, int], str] = {}  # (dev, inode) -> sha256 of content already read
    entries: list[Entry] = [store.find(ref)] if ref else list(store.entries())
    for entry in entries:
        report.entries += 1
        if entry.outdated:
            report.outdated.append(f"{entry.kind}/{entry.key}")
            continue
        problems = _check_entry(store, entry, hashed, report)
        if problems:
            report.problems.extend(VerifyProblem(**p.as_dict()) for p in problems)
            moved = store.quarantine(entry, problems)
            if moved is not None:
                report.quarantined.append(f"{entry.kind}/{entry.key}")
            # A damaged manifest has no digest of its own: what it was is what the build records say.
            for digest in recorded_digests(store, entry.kind, entry.key) if entry.damage else [entry.digest]:
                if digest in pins:
                    report.pinned.append(PinnedDamage(
                        kind=entry.kind, key=entry.key, digest=digest, channels=pins[digest],
                        files=sorted({p.file or p.reason for p in problems}), quarantine=str(moved) if moved else None))
    # Pinned entries quarantined by an earlier run (or by a build) and not restored since: still damage.
    reported = {p.digest for p in report.pinned}
    for item in store.quarantined_entries():
        digests = [item["digest"]]
        if any(isinstance(p, dict) and p.get("file") == MANIFEST for p in item["problems"]):
            digests = recorded_digests(store, item["kind"], item["key"])
        for digest in digests:
            if digest in pins and digest not in reported and not ref and store.healthy(item["kind"], item["key"], digest) is None:
                reported.add(digest)
                report.pinned.append(PinnedDamage(
                    kind=item["kind"], key=item["key"], digest=digest, channels=pins[digest],
                    files=sorted({p.get("file") or p.get("reason") for p in item["problems"]}), quarantine=item["path"]))
    if ref:
        return report
    for digest, path in store.objects.iter_objects():
        report.objects += 1
        try:
            st = path.lstat()
        except FileNotFoundError:
            continue  # moved aside with a corrupt entry above
        actual = hashed.get((st.st_dev, st.st_ino))
        if actual is None and not stat.S_ISREG(st.st_mode):
            actual = "not a regular file"  # never opened: a FIFO would block the read
        elif actual is None:
            try:
                actual = sha256_file(path)
            except OSError:
                actual = "unreadable"
            report.bytes_hashed += st.st_size
        if actual != digest:
            report.problems.append(VerifyProblem(kind="object", key=digest,
                                                 reason=actual if len(actual) != 64 else "sha256 mismatch"))
            store.objects.discard(digest, into=store.root / "quarantine" / "objects")
    return report


def _check_entry(store: Store, entry: Entry, hashed: dict[tuple[int, int], str], report: VerifyReport) -> list[Problem]:
    # Sizes and stray files first (cheap); then digests, remembering each inode's content hash.
    problems = [p for p in store.check(entry, digests=False)]
    if problems:
        return problems
    for item in entry.files:
        path = entry.path / item["path"]
        st = os.stat(path)
        ident = (st.st_dev, st.st_ino)
        actual = hashed.get(ident)
        if actual is None:
            try:
                actual = sha256_file(path)
            except OSError as err:  # cannot be read, so cannot be vouched for: damage, set aside and repaired
                problems.append(Problem(entry.kind, entry.key, item["path"], f"unreadable ({err.strerror or err})"))
                continue
            report.bytes_hashed += st.st_size
            hashed[ident] = actual
        if actual != item["sha256"]:
            problems.append(Problem(entry.kind, entry.key, item["path"], "sha256 mismatch"))
    listed = {item["path"] for item in entry.files}
    for folder, _, names in os.walk(entry.path):
        for name in names:
            rel = os.path.relpath(os.path.join(folder, name), entry.path).replace(os.sep, "/")
            if rel != "manifest.json" and rel not in listed:
                problems.append(Problem(entry.kind, entry.key, rel, "file not in manifest"))
    return problems
