"""The local artifact store.

Layout under the store root (the workspace's, `trtpipe.workspace`: --store, $TRTPIPE_STORE, $TRTPIPE_HOME,
else the user cache dir):

    objects/sha256/ab/cdef...     content-addressed files, stored once, read-only (0444)
    <kind>/<key>/                 an entry: the artifact's files (hard links to objects) + manifest.json;
                                  frozen (files 0444, folders 0555), never modified, never served in place
    tmp/<kind>-<key>-XXXX/        a build in progress; published by ONE rename into <kind>/<key>
    locks/<kind>/<key>.lock|lease build locks and in-use leases (see locking.py)
    quarantine/                   entries and objects found corrupt, moved aside with their manifest
                                  (gc deletes them, except an entry a channel pins and nothing replaced)
    trash/                        entries being deleted (renamed here first, so removal is atomic)
    records/                      build records (trtpipe.build_record): when, where, how long, logs
    serving/                      serving directories `trtpipe serve` gives Triton (trtpipe.serving.serving_copy)
    builds.log                    one JSON line per stage actually built (audit and tests)
    digests.sqlite                the digest cache
    channels/, results/, audit/   the release area's (`trtpipe.release`): the store takes the digests
                                  channels pin as an argument (gc, verify) and never reads them itself

An entry's manifest.json is content only, canonical JSON (sorted keys, no whitespace):
    {"manifest_version": 2, "kind", "key", "inputs": <the key document>,
     "files": [{"path", "mode": "0644"|"0755", "size", "sha256"}, ...sorted by path]}
Its digest (`Entry.digest`, the artifact digest) is "sha256:" + sha256(manifest bytes). Nothing about
when, where, by whom or how long enters it: that is the build record's. The same inputs built in any
store, at any path, on any day give the same manifest bytes and so the same digest.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import stat
import re
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from trtpipe.errors import IntegrityError, InternalError, InvalidInput, NotFound, UsageError
from trtpipe.store.digest_cache import DigestCache
from trtpipe.store.keys import canonical_json
from trtpipe.store.locking import KeyLocks
from trtpipe.store.manifest import KINDS, MANIFEST, MANIFEST_VERSION, entry_path_problem, parse_manifest, sound_files
from trtpipe.store.objects import ObjectStore, sha256_file
from trtpipe.store.readonly import DIR_MODE, freeze_tree, normalized_mode, remove_tree

__all__ = ["KINDS", "MANIFEST", "MANIFEST_VERSION", "Building", "Entry", "Problem", "Store", "manifest_digest"]
_KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def _check_kind_key(kind: str, key: str) -> None:
    if kind not in KINDS:
        raise UsageError(f"unknown artifact kind {kind!r}", fix=f"use one of {', '.join(KINDS)}")
    if not _KEY_RE.match(key):
        raise UsageError(f"invalid artifact key {key!r}", fix="a key is letters, digits, '.', '_' or '-'")


def manifest_digest(manifest_bytes: bytes) -> str:
    import hashlib

    return "sha256:" + hashlib.sha256(manifest_bytes).hexdigest()


def _now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


@dataclass(frozen=True)
class Entry:
    """A published artifact: `path` holds its files, `manifest` describes them, `digest` names it."""

    kind: str
    key: str
    path: Path
    manifest: dict[str, Any]  # always a dict; {} when manifest.json is not a JSON object
    digest: str
    damage: str | None = None  # why manifest.json is unusable (None: sound, or merely outdated)

    @functools.cached_property
    def files(self) -> list[dict[str, Any]]:
        """The manifest's file items ({path, mode, size, sha256}); none for a damaged manifest, and only the
        well-formed ones of an outdated one, so every reader may index them."""
        return [] if self.damage is not None else sound_files(self.manifest)

    @property
    def inputs(self) -> dict[str, Any]:
        """The key document the entry was built from (what it is a function of)."""
        inputs = self.manifest.get("inputs")
        return inputs if isinstance(inputs, dict) else {}

    @property
    def name(self) -> str | None:
        """The artifact name its key document records (repositories; None for engines and checkpoints)."""
        name = self.inputs.get("name")
        return name if isinstance(name, str) else None

    @property
    def target(self) -> str | None:
        """The target GPU its key document records (a repository's target, an engine's GPU product)."""
        target, gpu = self.inputs.get("target"), self.inputs.get("gpu")
        if isinstance(target, dict) and isinstance(target.get("gpu"), str):
            return target["gpu"]
        if isinstance(gpu, dict) and isinstance(gpu.get("product"), str):
            return gpu["product"]
        return None

    @property
    def current(self) -> bool:
        """Written in this trtpipe's manifest format, and sound (an older one is a miss: rebuilt, not used)."""
        return self.damage is None and self.manifest.get("manifest_version") == MANIFEST_VERSION

    @property
    def outdated(self) -> bool:
        """A sound manifest of another trtpipe's format: rebuilt by the next build, not damage."""
        return self.damage is None and not self.current

    @property
    def size(self) -> int:
        return sum(int(f["size"]) for f in self.files)

    @property
    def last_used(self) -> float:
        """Last reuse time (the manifest's mtime, refreshed on every reuse)."""
        try:
            return (self.path / MANIFEST).stat().st_mtime
        except FileNotFoundError:
            return 0.0


@dataclass
class Problem:
    """One integrity problem found in an entry or object."""

    kind: str
    key: str
    file: str | None
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "key": self.key, "file": self.file, "reason": self.reason}


@dataclass
class Building:
    """Handle given by `Store.building`: either `existing` (reuse it) or write into `dir` and `commit`."""

    store: Store
    kind: str
    key: str
    existing: Entry | None
    dir: Path | None = None
    entry: Entry | None = None
    _started: float = field(default_factory=time.monotonic)

    def commit(self, *, inputs: dict[str, Any], sources: Sequence[Entry] = (),
               known: Mapping[Path, str] | None = None) -> Entry:
        """Publish what was written into `dir` under the key document `inputs` (content only: when,
        where and how long belong in the build record, not here).

        Digests travel with bytes: a file that is a hard link to a file of `sources` (the stored inputs
        the stage built on, verified in this run) takes that file's sha256 from its manifest, and a
        file in `known` ({path: sha256}: what the stage hashed while writing it) takes that one; only
        the rest is read to be hashed, once."""
        if self.existing is not None or self.dir is None:
            raise RuntimeError("this key already has an entry; reuse `existing` instead of committing")
        if self.entry is not None:
            raise RuntimeError("already committed")
        self.entry = self.store._publish(self.kind, self.key, self.dir, inputs, sources=sources, known=known or {})
        return self.entry


class Store:
    """A content-addressed artifact store in one local directory."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.objects = ObjectStore(self.root / "objects", self.root / "quarantine" / "objects")
        self.locks = KeyLocks(self.root / "locks")
        self._digests: DigestCache | None = None
        # (kind, key, digest, problems) of every entry this instance moved to quarantine, for reports.
        self.quarantined: list[tuple[str, str, str, list[Problem]]] = []
        # (st_dev, st_ino) -> the stat at which this store last vouched for the inode's bytes (verified it,
        # or published it): what lets our own later links re-date its digest-cache rows (see _restamp_shared).
        self._vouched: dict[tuple[int, int], os.stat_result] = {}
        self.hashed_bytes = 0  # bytes this instance read to hash at commit (benchmarks report it)

    # -- opening ---------------------------------------------------------------------------
    @classmethod
    def open(cls, root: Path | str) -> Store:
        """The store at `root`, created if missing (the workspace decides where: `trtpipe.workspace`)."""
        store = cls(Path(root).expanduser())
        try:
            for sub in ("objects", "tmp", "locks", "records"):
                (store.root / sub).mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise InvalidInput(
                f"cannot create the artifact store at {store.root}: {err.strerror}",
                fix="choose a writable directory for the store (TRTPIPE_HOME, TRTPIPE_STORE)",
            ) from err
        return store

    @classmethod
    def holding(cls, path: Path) -> tuple[Store, Entry] | None:
        """(the store, the entry) when `path` is an entry directory of a trtpipe store, else None.
        The entry may be of an older manifest format (check `entry.current`)."""
        path = Path(path).expanduser().resolve()
        if path.parent.name not in KINDS or not (path / MANIFEST).is_file() or not _KEY_RE.match(path.name):
            return None
        store = cls(path.parent.parent)
        entry = store.peek(path.parent.name, path.name)
        return (store, entry) if entry is not None else None

    @property
    def digests(self) -> DigestCache:
        if self._digests is None:
            self._digests = DigestCache(self.root / "digests.sqlite")
        return self._digests

    def close(self) -> None:
        """Close the digest cache's database connection, if one was opened."""
        if self._digests is not None:
            self._digests.close()

    def entry_dir(self, kind: str, key: str) -> Path:
        _check_kind_key(kind, key)
        return self.root / kind / key

    # -- reading ---------------------------------------------------------------------------
    def _load(self, kind: str, key: str) -> Entry | None:
        path = self.entry_dir(kind, key)
        try:
            raw = (path / MANIFEST).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as err:  # unreadable (permissions, I/O error) or not a file: damage, named
            raw = b""
            manifest, damage = {}, f"cannot be read ({err.strerror or err})"
        else:
            manifest, damage = parse_manifest(raw, kind, key)
        return Entry(kind=kind, key=key, path=path, manifest=manifest, digest=manifest_digest(raw), damage=damage)

    def check(self, entry: Entry, *, digests: bool) -> list[Problem]:
        """Integrity problems of an entry: sizes always, sha256 and stray files when `digests`."""
        if entry.damage is not None:
            return [Problem(entry.kind, entry.key, MANIFEST, entry.damage)]
        problems: list[Problem] = []
        listed = set()
        for item in entry.files:
            rel = item["path"]
            listed.add(rel)
            target = entry.path / rel
            why = _file_problem(target, item["size"])
            if why is None and digests:
                why = _digest_problem(lambda: sha256_file(target), item["sha256"])
                if why is None:  # just read and matched: the digest cache may vouch for it from now on
                    self._vouch(target, item["sha256"])
            if why is not None:
                problems.append(Problem(entry.kind, entry.key, rel, why))
        if digests:
            problems += self._stray_files(entry, listed)
        return problems

    @staticmethod
    def _stray_files(entry: Entry, listed: set[str]) -> list[Problem]:
        return [
            Problem(entry.kind, entry.key, rel, "file not in manifest")
            for rel in (p.relative_to(entry.path).as_posix() for p in _walk_files(entry.path))
            if rel != MANIFEST and rel not in listed
        ]

    def verify_entry(self, entry: Entry) -> list[Problem]:
        """Every file's sha256 against the manifest, through the digest cache (a file unchanged since
        it was last hashed, by path, size, mtime, ctime and inode, is not read again), and no
        stray files. What a stage runs before it builds on a stored input, and `serve` before it
        hands an entry's files to a server."""
        problems = self.check(entry, digests=False)
        if problems:
            return problems
        for item in entry.files:
            path = entry.path / item["path"]
            try:
                actual, st = self.digests.digest_with_stat(path)
            except OSError as err:
                problems.append(Problem(entry.kind, entry.key, item["path"], f"unreadable ({err.strerror or err})"))
                continue
            if actual != item["sha256"]:
                problems.append(Problem(entry.kind, entry.key, item["path"], "sha256 mismatch"))
            else:
                self._vouched[(st.st_dev, st.st_ino)] = st
        return problems + self._stray_files(entry, {item["path"] for item in entry.files})

    def get(self, kind: str, key: str, *, verify: bool = False, touch: bool = True) -> Entry | None:
        """The entry of `kind/key`, or None. A corrupt entry is moved aside and None returned; an
        entry written in an older manifest format is a plain miss (the build replaces it)."""
        entry = self._load(kind, key)
        if entry is None or entry.outdated:
            return None
        problems = self.check(entry, digests=verify)
        if problems:
            self.quarantine(entry, problems)
            return None
        if touch:
            with contextlib.suppress(OSError):
                os.utime(entry.path / MANIFEST)
        return entry

    def peek(self, kind: str, key: str) -> Entry | None:
        """The entry if present, without checks or touching (dry runs, listings)."""
        return self._load(kind, key)

    def entries(self, kind: str | None = None) -> Iterator[Entry]:
        for k in (kind,) if kind else KINDS:
            folder = self.root / k
            if not folder.is_dir():
                continue
            for child in sorted(folder.iterdir()):
                if child.is_dir() and _KEY_RE.match(child.name):
                    entry = self._load(k, child.name)
                    if entry is not None:
                        yield entry

    def find(self, ref: str) -> Entry:
        """Resolve `kind/key`, a key, a key prefix (>= 4 chars) or an artifact digest to one entry."""
        kind, _, key = ref.rpartition("/") if "/" in ref else ("", "", ref)
        if kind and kind not in KINDS:
            raise UsageError(f"unknown artifact kind {kind!r} in {ref!r}", fix=f"use one of {', '.join(KINDS)}")
        wanted = key.removeprefix("sha256:") if key.startswith("sha256:") else None
        if len(key) < 4:
            raise UsageError(f"key {ref!r} is too short", fix="give at least 4 characters of the key")
        matches = []
        for entry in self.entries(kind or None):
            if wanted is not None:
                if entry.digest.removeprefix("sha256:").startswith(wanted):
                    matches.append(entry)
            elif entry.key.startswith(key):
                matches.append(entry)
        if not matches:
            raise NotFound(f"no artifact in {self.root} matches {ref!r}", what="artifact", ref=ref,
                           fix="give a key, key prefix or digest of a stored artifact")
        if len(matches) > 1:
            names = ", ".join(f"{e.kind}/{e.key[:12]}" for e in matches[:5])
            raise UsageError(f"{ref!r} matches {len(matches)} artifacts ({names})", fix="give more of the key or kind/key")
        return matches[0]

    # -- writing ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def building(
        self,
        kind: str,
        key: str,
        *,
        force: bool = False,
        verify: bool = False,
        on_wait: Callable[[], None] | None = None,
    ) -> Iterator[Building]:
        """Hold the key's build lock. `b.existing` is set when the entry exists (perhaps built by a
        concurrent process while we waited); otherwise write into `b.dir` and call `b.commit`.
        Nothing is visible under `<kind>/<key>` until commit's single rename."""
        _check_kind_key(kind, key)
        with self.locks.building(kind, key, on_wait=on_wait):
            self._clean_tmp_for(kind, key)
            existing = None if force else self.get(kind, key, verify=verify)
            if existing is not None:
                yield Building(self, kind, key, existing=existing)
                return
            tmp_dir = Path(tempfile.mkdtemp(prefix=f"{kind}-{key}-", dir=self.root / "tmp"))
            handle = Building(self, kind, key, existing=None, dir=tmp_dir)
            try:
                yield handle
            finally:
                if handle.entry is None:
                    self.discard_tree(tmp_dir)

    def _clean_tmp_for(self, kind: str, key: str) -> None:
        """Remove leftovers of killed builds of this key (we hold its lock, so they are stale)."""
        tmp = self.root / "tmp"
        # Also ".<kind>-<key>-*": staging folders a stage made beside its output dir.
        for pattern in (f"{kind}-{key}-*", f".{kind}-{key}-*"):
            for child in tmp.glob(pattern):
                self.discard_tree(child)

    def _publish(self, kind: str, key: str, tmp_dir: Path, inputs: dict[str, Any], *,
                 sources: Sequence[Entry] = (), known: Mapping[Path, str] | None = None) -> Entry:
        """Take each written file's digest (from its source entry or the stage, else by hashing it once),
        write the content-only manifest, freeze and rename into place."""
        if (tmp_dir / MANIFEST).exists():
            raise InternalError(f"the {kind} stage wrote a file named {MANIFEST}, which the store reserves",
                                fix="report this bug: a stage must not write that file")
        carried = self._carried_digests(sources, known or {})
        files: list[dict[str, Any]] = []
        for path in _walk_files(tmp_dir):
            rel = path.relative_to(tmp_dir).as_posix()
            why = entry_path_problem(rel)
            if why is not None:  # what a registry pull would refuse, the store refuses to publish
                raise InternalError(f"the {kind} stage wrote {rel[:120]!r}: {why}",
                                    fix="report this bug: a stage writes portable file names only")
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode):
                raise InternalError(f"the {kind} stage wrote {rel}, which is not a regular file (a symlink?)",
                                    fix="report this bug: a stage writes regular files only")
            digest = carried.get((st.st_dev, st.st_ino, st.st_size))
            if digest is None:
                digest = sha256_file(path)
                self.hashed_bytes += st.st_size
            files.append({"path": rel, "mode": normalized_mode(st.st_mode), "size": st.st_size, "sha256": digest})
        files.sort(key=lambda item: item["path"])
        manifest = {"manifest_version": MANIFEST_VERSION, "kind": kind, "key": key, "inputs": inputs, "files": files}
        return self._install(kind, key, tmp_dir, canonical_json(manifest), manifest)

    def _carried_digests(self, sources: Sequence[Entry], known: Mapping[Path, str]) -> dict[tuple[int, int, int], str]:
        """(st_dev, st_ino, size) -> sha256 of the bytes a stage did not write itself (hard links to its
        stored inputs' files, which the runner verified before the stage built) or already hashed."""
        carried: dict[tuple[int, int, int], str] = {}
        for entry in sources:
            for item in entry.files:
                with contextlib.suppress(OSError):
                    st = os.stat(entry.path / item["path"])
                    carried[(st.st_dev, st.st_ino, item["size"])] = item["sha256"]
        for path, digest in known.items():
            with contextlib.suppress(OSError):
                st = os.lstat(path)
                carried[(st.st_dev, st.st_ino, st.st_size)] = digest
        return carried

    def install_verified(self, handle: Building, raw: bytes, verified: dict[str, str]) -> Entry:
        """Publish files that came from elsewhere (a registry pull) into `handle.dir`.

        `raw` is the artifact's manifest.json bytes; `verified` maps each file's path to the sha256
        its bytes were verified against while they were written. The manifest must be this
        trtpipe's canonical format for exactly `handle`'s kind and key, and list every file there
        exactly once with that very sha256 and its size: an object only ever enters the store under
        the digest of its own bytes.
        """
        kind, key, tmp_dir = handle.kind, handle.key, Path(handle.dir or "")
        where = f"the {kind} manifest of {key[:16]}"
        manifest, damage = parse_manifest(raw, kind, key)
        if damage is None and manifest.get("manifest_version") != MANIFEST_VERSION:
            raise IntegrityError(
                f"{where} has manifest version {manifest.get('manifest_version')!r}, not {MANIFEST_VERSION}; refused",
                fix="rebuild it with this trtpipe (older artifacts are rebuilt, never reused)",
            )
        if damage is not None:
            raise IntegrityError(f"{where}: {damage}; refused")
        listed: dict[str, dict[str, Any]] = {item["path"]: item for item in manifest["files"]}
        present = {p.relative_to(tmp_dir).as_posix(): p for p in _walk_files(tmp_dir)}
        if set(present) != set(listed) or set(verified) != set(listed):
            odd = sorted(set(present) ^ set(listed) | set(verified) ^ set(listed))
            raise IntegrityError(f"{where} and the files received differ ({', '.join(odd[:3])}); refused")
        for rel, item in listed.items():
            path = present[rel]
            if item["sha256"] != verified[rel] or item["size"] != path.stat().st_size:
                raise IntegrityError(
                    f"{where} lists {rel} as sha256:{item['sha256'][:12]}..., but its bytes are "
                    f"sha256:{verified[rel][:12]}...; refused",
                    fix="the artifact was tampered with; push it again from a good copy",
                )
        entry = self._install(kind, key, tmp_dir, raw, manifest)
        handle.entry = entry  # tells `building` the staging dir was consumed
        return entry

    def _install(self, kind: str, key: str, tmp_dir: Path, raw: bytes, manifest: dict[str, Any]) -> Entry:
        shared: list[str] = []  # files whose inode is stored elsewhere too (hard links to verified inputs)
        for item in manifest["files"]:
            path = tmp_dir / item["path"]
            st = os.lstat(path)
            if st.st_nlink == 1:
                _settle(path, st)
            else:
                shared.append(item["path"])
            _fsync_file(path)
            self.objects.adopt(path, item["sha256"], item["size"], known=self.digests.cached,
                               on_relink=self.digests.restamp_stats)
        manifest_path = tmp_dir / MANIFEST
        with open(manifest_path, "wb") as handle:
            handle.write(raw)
            handle.flush()
            os.fsync(handle.fileno())
        # Frozen before it becomes visible: files 0444, folders 0555 (the top folder after the
        # rename, which needs it writable to move it across folders).
        freeze_tree(tmp_dir)
        os.chmod(tmp_dir, 0o755)
        _fsync_dir(tmp_dir)
        final = self.entry_dir(kind, key)
        final.parent.mkdir(parents=True, exist_ok=True)
        if final.exists():  # a forced rebuild (or an old-format entry) is replaced: move it out first
            self._move_to(final, self.root / "trash")
        os.rename(tmp_dir, final)  # THE publish: one atomic rename
        os.chmod(final, DIR_MODE)
        _fsync_dir(final.parent)
        self._restamp_shared([final / rel for rel in shared])
        for item in manifest["files"]:  # the digests travel on: the next verification of this entry reads nothing
            self._vouch(final / item["path"], item["sha256"])
        return Entry(kind=kind, key=key, path=final, manifest=manifest, digest=manifest_digest(raw))

    def _vouch(self, path: Path, sha256: str) -> None:
        st = self.digests.vouch(path, sha256)
        if st is not None:
            self._vouched[(st.st_dev, st.st_ino)] = st

    def _restamp_shared(self, shared: list[Path]) -> None:
        """The stage hard-linked files of its verified inputs into the new entry: each link moved the
        inode's ctime. Re-date the digest-cache rows of those inodes from the stat at which this store
        vouched for them (verified or published them in this process), when size, mtime and inode show
        the bytes are the ones vouched for."""
        for path in shared:
            try:
                st = os.stat(path)
            except OSError:
                continue
            before = self._vouched.get((st.st_dev, st.st_ino))
            if before is not None and self.digests.restamp_stats(before, st):
                self._vouched[(st.st_dev, st.st_ino)] = st

    def discard_tree(self, path: Path) -> None:
        """Remove a tree of ours; a file hard-linked into the store has its digest-cache rows re-dated by the
        unlink (its ctime moves)."""
        remove_tree(path, on_unlink=self._unlinked)

    def _unlinked(self, before: os.stat_result, after: os.stat_result) -> None:
        if self.digests.restamp_stats(before, after):
            self._vouched[(after.st_dev, after.st_ino)] = after

    def _move_to(self, path: Path, folder: Path) -> Path | None:
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / f"{path.parent.name}-{path.name}-{int(time.time())}-{uuid.uuid4().hex[:8]}"
        try:
            os.chmod(path, 0o755)  # moving a folder to another parent rewrites its "..": it must be writable
            os.rename(path, target)
        except FileNotFoundError:
            return None
        return target

    def quarantine(self, entry: Entry, problems: list[Problem]) -> Path | None:
        """Move a corrupt entry (and its damaged objects) aside so it is never reused or published."""
        with self.locks.building(entry.kind, entry.key):
            current = self._load(entry.kind, entry.key)
            if current is None or current.digest != entry.digest:
                return None  # already moved or rebuilt by someone else
            bad_files = {p.file for p in problems if p.reason == "sha256 mismatch"}
            for item in entry.files:
                if item["path"] in bad_files:
                    obj = self.objects.path_for(item["sha256"])
                    with contextlib.suppress(OSError):
                        if os.path.samefile(obj, entry.path / item["path"]):
                            self.objects.quarantine_object(item["sha256"])
            moved = self._move_to(entry.path, self.root / "quarantine")
            if moved is not None:
                # Beside the entry (kept with its manifest, so it stays restorable): what was wrong, and
                # the digest it must be restored to.
                (moved.parent / f"{moved.name}.reason.json").write_text(json.dumps(
                    {"kind": entry.kind, "key": entry.key, "digest": entry.digest,
                     "problems": [p.as_dict() for p in problems]}, indent=1))
                self.quarantined.append((entry.kind, entry.key, entry.digest, problems))
            return moved

    def quarantined_entries(self) -> list[dict[str, Any]]:
        """Entries in `quarantine/`, each as its reason record (kind, key, digest, problems) + `path`."""
        out: list[dict[str, Any]] = []
        base = self.root / "quarantine"
        if not base.is_dir():
            return out
        for reason in sorted(base.glob("*.reason.json")):
            try:
                data = json.loads(reason.read_text())
            except (OSError, ValueError):
                continue
            if not isinstance(data, dict) or not isinstance(data.get("digest"), str):
                continue  # a record of an older trtpipe (a bare list of problems): nothing to restore to
            entry_dir = reason.with_name(reason.name[: -len(".reason.json")])
            if entry_dir.is_dir():
                out.append({**data, "problems": data.get("problems") or [], "path": str(entry_dir)})
        return out

    def healthy(self, kind: str, key: str, digest: str) -> Entry | None:
        """The entry of `kind/key` if it is there, of exactly `digest`, and passes the cheap checks."""
        entry = self._load(kind, key)
        if entry is None or entry.digest != digest or not entry.current or self.check(entry, digests=False):
            return None
        return entry

    def remove(self, entry: Entry) -> bool:
        """Delete an entry if nobody builds or uses it. False when it is in use."""
        with self.locks.try_exclusive(entry.kind, entry.key) as free:
            if not free:
                return False
            moved = self._move_to(entry.path, self.root / "trash")
        if moved is not None:
            self.discard_tree(moved)
        return True

    @contextlib.contextmanager
    def lease(self, entry: Entry) -> Iterator[Entry]:
        """Mark an entry in use for the duration (gc and rm skip it)."""
        with self.locks.lease(entry.kind, entry.key):
            yield entry

    def log_built(self, kind: str, key: str, digest: str, seconds: float) -> None:
        """Append one line to builds.log for each stage actually built (O_APPEND: safe across processes)."""
        line = canonical_json(
            {"kind": kind, "key": key, "digest": digest, "seconds": round(seconds, 6), "pid": os.getpid(), "at": _now_iso()}
        )
        fd = os.open(self.root / "builds.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, line + b"\n")
        finally:
            os.close(fd)


def _file_problem(path: Path, size: int) -> str | None:
    """Why a listed file is not there as listed (cheap: one lstat), or None."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return "missing"
    except OSError as err:
        return f"unreadable ({err.strerror or err})"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"  # a symlink, folder or FIFO in place of a stored file (never opened)
    if st.st_size != size:
        return f"size {st.st_size} != {size}"
    return None


def _digest_problem(digest: Callable[[], str], expected: str) -> str | None:
    """"sha256 mismatch", "unreadable (...)" or None: a file that cannot be read cannot be vouched for."""
    try:
        actual = digest()
    except OSError as err:
        return f"unreadable ({err.strerror or err})"
    return None if actual == expected else "sha256 mismatch"


def _walk_files(root: Path) -> Iterator[Path]:
    for folder, dirs, names in os.walk(root):
        dirs.sort()
        for name in sorted(names):
            if name.startswith(".tmp-link-"):
                continue
            yield Path(folder) / name


def _settle(path: Path, st: os.stat_result) -> None:
    """Date a freshly written file's mtime back by the digest cache's racy window (content-neutral: a
    manifest records no time), so its digest can be remembered at once: any later write sets mtime to the
    present, which a time in the past can never equal, so a rewrite of the same size is still caught."""
    from trtpipe.store.digest_cache import RACY_WINDOW_NS

    now = time.time_ns()
    if now - st.st_mtime_ns < RACY_WINDOW_NS:
        os.utime(path, ns=(st.st_atime_ns, now - RACY_WINDOW_NS - 1_000_000), follow_symlinks=False)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
