"""`cache verify`: re-hash every stored file; move corrupt artifacts and objects aside.

A file shared by hard link between an entry and its object is hashed once.
"""

from __future__ import annotations

import os

from pydantic import BaseModel, Field

from trtpipe.store.local import Entry, Problem, Store
from trtpipe.store.objects import sha256_file


class VerifyProblem(BaseModel):
    kind: str  # an artifact kind, or "object"
    key: str
    file: str | None = None
    reason: str


class VerifyReport(BaseModel):
    entries: int = 0
    objects: int = 0
    bytes_hashed: int = 0
    problems: list[VerifyProblem] = Field(default_factory=list)
    quarantined: list[str] = Field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_store(store: Store, *, ref: str | None = None) -> VerifyReport:
    report = VerifyReport()
    hashed: dict[tuple[int, int], str] = {}  # (dev, inode) -> sha256 of content already read
    entries: list[Entry] = [store.find(ref)] if ref else list(store.entries())
    for entry in entries:
        report.entries += 1
        problems = _check_entry(store, entry, hashed, report)
        if problems:
            report.problems.extend(VerifyProblem(**p.as_dict()) for p in problems)
            moved = store.quarantine(entry, problems)
            if moved is not None:
                report.quarantined.append(f"{entry.kind}/{entry.key}")
    if ref:
        return report
    for digest, path in store.objects.iter_objects():
        report.objects += 1
        try:
            st = path.stat()
        except FileNotFoundError:
            continue  # moved aside with a corrupt entry above
        actual = hashed.get((st.st_dev, st.st_ino))
        if actual is None:
            actual = sha256_file(path)
            report.bytes_hashed += st.st_size
        if actual != digest:
            report.problems.append(VerifyProblem(kind="object", key=digest, reason="sha256 mismatch"))
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
            actual = sha256_file(path)
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
