"""Serving copies: Triton gets a verified copy of a repository, never the store entry itself.

A Python backend writes `__pycache__` next to each model.py, a user edits a config.pbtxt, a server
running as root can write anything: none of it may touch a stored artifact. `prepare(repo)` makes a
serving directory outside the entry (`<store>/serving/<digest12>-<unique>/`, see
`trtpipe.store.serving_dirs`) and fills it:
- engine files (trtpipe.json `engine.files`, except config.json) are hard links to the stored
  files: O(1) in engine size (benchmarks/serving_dir.py measures it). They share the store's inodes,
  which stay read-only; `trtpipe cache verify` catches any write through them;
- everything else (config.pbtxt, model.py, tokenizer files, trtpipe.json) is copied: small, and
  free to change;
- every config.pbtxt copy gets the `trtpipe_repository_digest` parameter: the repository's artifact
  digest, which cannot be inside the content it is the digest of (`trtpipe.serving.identity`), and
  `trtpipe_serve_token`, this serve's random token, which the lease's lock file pairs with that digest
  (smoke and bench record only against a server whose token names a live serve of the digest);
- only the files the entry's manifest lists are served (for a verified copy outside the store, the list
  the trust policy verified), and each copied file is hashed as it is copied and refused if it is not
  the sha256 that manifest names.
Before anything is linked, the entry is verified (every file's sha256 through the digest cache: a
file unchanged since it was last hashed is not read again), so a damaged entry is never served.
The directory is removed when the server stops; one left by a killed server is removed by the next
`serve` (or `cache gc`). `kept=True` (`serve --print`, the Triton container) keeps one directory per
digest, reused, because trtpipe does not own that server's lifetime.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import secrets
import shutil
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from trtpipe.errors import IntegrityError, InvalidInput
from trtpipe.serving import identity
from trtpipe.serving.templates import ENGINE_SUBDIR, MANIFEST_NAME


class VerifiedSet(Protocol):
    """What a trust check verified (`trtpipe.release.trust.VerifiedFolder`; the release layer sits above this one)."""

    @property
    def digest(self) -> str | None: ...

    @property
    def files(self) -> dict[str, dict[str, str]]: ...  # relative path -> {"sha256", "mode"}



@dataclass
class ServingDir:
    """A prepared serving directory; `remove()` it when its server is gone (not for kept ones)."""

    path: Path
    source: Path
    repository_digest: str | None
    kept: bool = False
    linked: list[str] = field(default_factory=list)  # relative paths hard-linked to the store
    copied: list[str] = field(default_factory=list)
    # This serve's token (trtpipe.serving.identity.SERVE_TOKEN), with the digest in the lease's serve record; None
    # for a kept directory (a server trtpipe does not own: results against it are not recorded).
    serve_token: str | None = None
    _lease: object | None = field(default=None, repr=False)
    _stamps: list[tuple[Path, Path]] = field(default_factory=list, repr=False)  # (store file, serving link)
    _store: object | None = field(default=None, repr=False)

    @property
    def lock_fd(self) -> int | None:
        """The serving directory's lock (None for kept ones): a server process should inherit it."""
        return self._lease.lock_fd if self._lease is not None else None  # type: ignore[attr-defined]

    def remove(self) -> None:
        if self.kept or self._lease is None:
            return
        for stored, link in self._stamps:
            # Our unlink moves the stored inode's ctime: re-date its digest-cache row, but only if
            # nothing else touched the inode since we linked it (the row then still matches).
            try:
                before = os.stat(stored)
            except FileNotFoundError:
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(link)
            if self._store is not None:
                self._store.digests.restamp(stored, before)  # type: ignore[attr-defined]
        self._lease.release()  # type: ignore[attr-defined]
        if self._store is not None:
            self._store.digests.close()  # type: ignore[attr-defined]
        self._lease = None


def _store_entry(repo: Path):
    """(store, entry) when `repo` is a repository entry of a trtpipe store, else (None, None). A serving
    directory lives in the store that holds the entry (its engine files are hard links into it)."""
    from trtpipe.store.local import Store

    found = Store.holding(repo)
    if found is None or found[1].kind != "repository":
        return None, None
    return found


def _engine_files(repo: Path) -> set[str]:
    """The repository's engine files that are linked, not copied (trtpipe.json `engine.files`; for an llmapi
    repository the LLM-API artifact's weights, `artifact.files` under `artifact.dir`)."""
    try:
        manifest = json.loads((repo / MANIFEST_NAME).read_text())
    except (OSError, ValueError):
        return set()
    if not isinstance(manifest, dict):
        return set()
    section, default_dir = manifest.get("engine"), ENGINE_SUBDIR
    if not isinstance(section, dict) and isinstance(manifest.get("artifact"), dict):
        section = manifest["artifact"]
        default_dir = str(section.get("dir") or "")
    names = section.get("files") if isinstance(section, dict) else None
    if not isinstance(names, list) or not default_dir:
        return set()
    return {f"{default_dir}/{n}" for n in names if isinstance(n, str) and n != "config.json"}


def prepare(repo: Path, *, kept: bool = False, verified: VerifiedSet | None = None) -> ServingDir:
    """A serving directory for the published repository `repo` (see the module docstring). `verified`: what a
    trust policy checked (`trtpipe.release.trust.require_trusted_folder`): exactly its files are copied, each
    checked against its signed sha256 as it is copied, so nothing added or changed after the check is served."""
    from trtpipe.store.serving_dirs import (
        kept_serving_dir,
        new_serving_dir,
        remove_stale,
        serving_root,
        write_serve_record,
    )

    repo = Path(repo).resolve()
    store, entry = _store_entry(repo)
    if verified is not None and verified.digest is not None and (entry is None or entry.digest != verified.digest):
        if entry is not None:
            raise IntegrityError(f"{repo} changed after its signature was verified (its manifest is now "
                                 f"{entry.digest}, not {verified.digest}); not served", path=str(repo),
                                 fix="serve it again once nothing writes to it")
        store = None  # a verified copy outside the store: its files come from the verified list, below
    expected: dict[str, str] = {}
    if store is not None and entry is not None:
        if entry.outdated:
            raise InvalidInput(f"{repo} was published by an older trtpipe (old manifest format)",
                               fix="rebuild it from its spec and serve the new repository")
        problems = store.verify_entry(entry)
        if problems:
            store.quarantine(entry, problems)
            raise IntegrityError(
                f"{repo} failed verification ({problems[0].file}: {problems[0].reason}); it was moved to quarantine "
                "and not served", path=str(repo), in_store=True,
                fix="rebuild it from its spec, or restore it to its digest",
            )
        files = {item["path"]: item["mode"] for item in entry.files}
        expected = {item["path"]: item["sha256"] for item in entry.files}
        base, label, digest = serving_root(store.root), entry.digest.removeprefix("sha256:")[:12], entry.digest
        remove_stale(store.root)
    elif verified is not None and verified.digest is not None:
        # A signed repository's copy outside any store: its verified files, nothing else that sits beside them.
        files = {rel: item["mode"] for rel, item in verified.files.items()}
        expected = {rel: item["sha256"] for rel, item in verified.files.items()}
        base, label, digest = (Path(tempfile.gettempdir()) / "trtpipe-serving",
                               "verified-" + verified.digest.removeprefix("sha256:")[:12], None)
    else:
        if kept:  # not a stored artifact: nothing to protect, and nobody would clean a copy up
            return ServingDir(path=repo, source=repo, repository_digest=None, kept=True)
        files = {p.relative_to(repo).as_posix(): ("0755" if os.stat(p).st_mode & 0o111 else "0644")
                 for p in sorted(repo.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}
        base, label, digest = Path(tempfile.gettempdir()) / "trtpipe-serving", "unstored", None
    link = _engine_files(repo)
    if kept:
        final = kept_serving_dir(base, label)
        if final.is_dir():
            return ServingDir(path=final, source=repo, repository_digest=digest, kept=True)
        staging = base / f".{final.name}-{uuid.uuid4().hex[:8]}"
        staging.mkdir(parents=True)
        serving = ServingDir(path=staging, source=repo, repository_digest=digest, kept=True, _store=store)
        try:
            _fill(serving, repo, files, link, digest, expected)
            try:
                os.rename(staging, final)
            except OSError:  # another serve made it meanwhile: same digest, same content
                shutil.rmtree(staging, ignore_errors=True)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        serving.path = final
        if store is not None:
            store.digests.close()
        return serving
    lease = new_serving_dir(base, label)
    serving = ServingDir(path=lease.path, source=repo, repository_digest=digest, _lease=lease, _store=store)
    try:
        if digest is not None:
            serving.serve_token = secrets.token_hex(16)
            # Written before any file: the record says which digest this serve checked every byte against.
            write_serve_record(lease, {"digest": digest, "token": serving.serve_token})
        _fill(serving, repo, files, link, digest, expected)
    except BaseException:
        serving.remove()
        raise
    return serving


def _changed(repo: Path, rel: str, actual: str, wanted: str) -> IntegrityError:
    return IntegrityError(f"{repo / rel} changed after it was verified (sha256 {actual[:12]}, not {wanted[:12]}); "
                          "not served", path=str(repo / rel), fix="serve it again once nothing writes to it")


def _fill(serving: ServingDir, repo: Path, files: dict[str, str], link: set[str], digest: str | None,
          expected: dict[str, str]) -> None:
    """Link or copy `files` from `repo`. A file with an `expected` sha256 is checked as it is served: a copy
    is written from the very bytes that were hashed, so what the server reads is what was verified. Left
    open: a hard-linked engine file shares the store's (read-only) inode, so a write through the store path
    after the check (a chmod first) reaches the server; `cache verify` finds it. A linked file outside any
    store (a verified copy) is hashed through its new link, after linking, which leaves the same window."""
    store = serving._store
    # Every model needs its version folder, even the ensemble's empty one; a manifest lists files
    # only (an empty folder is not content and does not survive a registry round trip).
    for rel in files:
        parts = rel.split("/")
        if len(parts) == 2 and parts[1] == "config.pbtxt":
            (serving.path / parts[0] / "1").mkdir(parents=True, exist_ok=True)
    for rel, mode in sorted(files.items()):
        src, dst = repo / rel, serving.path / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if rel in link:
            before = os.stat(src)
            try:
                os.link(src, dst)
            except OSError as err:
                if err.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
                    raise
                shutil.copyfile(src, dst)  # another filesystem: a copy (not O(1), but never the entry)
                os.chmod(dst, 0o444)
                serving.copied.append(rel)
                continue
            serving.linked.append(rel)
            if store is not None:
                store.digests.restamp(src, before)  # type: ignore[attr-defined]
                serving._stamps.append((src, dst))
            elif rel in expected:
                actual = _sha256_file(dst)
                if actual != expected[rel]:
                    raise _changed(repo, rel, actual, expected[rel])
            continue
        if rel in expected:
            body = src.read_bytes()
            actual = hashlib.sha256(body).hexdigest()
            if actual != expected[rel]:
                raise _changed(repo, rel, actual, expected[rel])
            dst.write_bytes(body)
        else:
            shutil.copyfile(src, dst)
        os.chmod(dst, 0o755 if mode == "0755" else 0o644)
        serving.copied.append(rel)
        if digest is not None and dst.name == "config.pbtxt":
            text = dst.read_text()
            values = {identity.REPOSITORY_DIGEST: digest}
            if serving.serve_token is not None:
                values[identity.SERVE_TOKEN] = serving.serve_token
            dst.write_text(identity.add_parameters(text, values, where=f"{repo / rel}"))


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
