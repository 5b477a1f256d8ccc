"""The local store itself, with small files: publish, dedupe, integrity, locks, gc."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from pathlib import Path

import pytest

from trtpipe.errors import NotFound, UsageError
from trtpipe.store import gc
from trtpipe.store.local import Store
from trtpipe.store.objects import sha256_file
from trtpipe.store.verify import verify_store


def _commit(store: Store, kind: str, key: str, files: dict[str, bytes], inputs: dict | None = None) -> object:
    with store.building(kind, key) as b:
        assert b.existing is None
        for name, data in files.items():
            (b.dir / name).parent.mkdir(parents=True, exist_ok=True)
            (b.dir / name).write_bytes(data)
        return b.commit(inputs=inputs if inputs is not None else {"what": key})


def test_commit_writes_a_content_only_manifest_and_links_objects(store: Store) -> None:
    entry = _commit(store, "checkpoint", "k1", {"config.json": b"{}", "rank0.safetensors": b"w" * 1000})
    assert entry.path == store.root / "checkpoint" / "k1"
    raw = (entry.path / "manifest.json").read_bytes()
    manifest = json.loads(raw)
    # Exactly the content: no time, host, path, duration or storage detail.
    assert set(manifest) == {"manifest_version", "kind", "key", "inputs", "files"}
    assert manifest["manifest_version"] == 2 and manifest["kind"] == "checkpoint"
    assert manifest["key"] == "k1" and manifest["inputs"] == {"what": "k1"}
    assert raw == json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()  # canonical
    assert [f["path"] for f in manifest["files"]] == ["config.json", "rank0.safetensors"]
    for item in manifest["files"]:
        path = entry.path / item["path"]
        assert set(item) == {"path", "mode", "size", "sha256"} and item["mode"] == "0644"
        assert item["size"] == path.stat().st_size and item["sha256"] == sha256_file(path)
        assert os.path.samefile(path, store.objects.path_for(item["sha256"]))  # a hard link, not a copy
    import hashlib

    assert entry.digest == "sha256:" + hashlib.sha256(raw).hexdigest()
    assert store.get("checkpoint", "k1", verify=True).digest == entry.digest
    assert not list((store.root / "tmp").iterdir())


def test_entries_are_frozen_and_removable(store: Store) -> None:
    import stat

    entry = _commit(store, "repository", "r1", {"a/config.pbtxt": b"x", "a/1/model.py": b"print(1)\n", "t.json": b"{}"})
    for path in [entry.path, *entry.path.rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o555 if path.is_dir() else 0o444), (path, oct(mode))
    assert store.remove(entry)
    assert not entry.path.exists() and not list((store.root / "trash").iterdir())


def test_same_inputs_give_the_same_digest_in_any_store_at_any_time(tmp_path: Path) -> None:
    files = {"config.json": b"{}", "sub/rank0.safetensors": b"w" * 3000}
    first = _commit(Store.open(tmp_path / "one"), "engine", "k", files, inputs={"a": 1})
    time.sleep(1.1)
    second = _commit(Store.open(tmp_path / "elsewhere" / "two"), "engine", "k", files, inputs={"a": 1})
    assert first.digest == second.digest
    assert (first.path / "manifest.json").read_bytes() == (second.path / "manifest.json").read_bytes()


def test_executable_bit_is_content(store: Store) -> None:
    with store.building("engine", "x") as b:
        (b.dir / "run.sh").write_bytes(b"#!/bin/sh\n")
        (b.dir / "run.sh").chmod(0o755)
        entry = b.commit(inputs={})
    assert entry.files[0]["mode"] == "0755"
    plain = _commit(store, "engine", "y", {"run.sh": b"#!/bin/sh\n"}, inputs={})
    assert plain.files[0]["mode"] == "0644" and plain.digest != entry.digest


def test_an_entry_of_an_older_manifest_version_is_a_miss_and_replaced(store: Store) -> None:
    entry = _commit(store, "engine", "old", {"x": b"1"})
    manifest = json.loads((entry.path / "manifest.json").read_bytes())
    manifest["manifest_version"] = 1
    manifest["created_at"] = "2025-01-01T00:00:00"
    (entry.path).chmod(0o755)
    (entry.path / "manifest.json").chmod(0o644)
    (entry.path / "manifest.json").write_text(json.dumps(manifest))
    assert store.get("engine", "old") is None  # a miss, not an error, not quarantined
    assert not (store.root / "quarantine").exists()
    assert verify_store(store, pins={}).outdated == ["engine/old"]
    with store.building("engine", "old") as b:
        assert b.existing is None
        (b.dir / "x").write_bytes(b"1")
        rebuilt = b.commit(inputs={"what": "old"})
    assert rebuilt.digest == entry.digest and store.get("engine", "old") is not None


def test_adopt_never_links_onto_an_object_holding_other_bytes(store: Store) -> None:
    """An object whose bytes are not its name's (however they got there) is never linked into an entry."""
    good = b"G" * 4096
    digest = sha256_file_bytes(good)
    forged = store.objects.path_for(digest)
    forged.parent.mkdir(parents=True)
    forged.write_bytes(b"B" * 4096)  # same size, other bytes, under the good bytes' digest
    entry = _commit(store, "repository", "r", {"preprocessing/1/model.py": good})
    assert (entry.path / "preprocessing/1/model.py").read_bytes() == good
    assert store.objects.path_for(digest).read_bytes() == good
    assert store.objects.corrupt == [digest]
    assert (store.root / "quarantine" / "objects" / digest).read_bytes() == b"B" * 4096
    assert verify_store(store, pins={}).ok


def sha256_file_bytes(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def test_identical_files_are_stored_once(store: Store) -> None:
    a = _commit(store, "checkpoint", "a", {"rank0.safetensors": b"same" * 500})
    b = _commit(store, "engine", "b", {"rank0.safetensors": b"same" * 500, "config.json": b"{}"})
    assert os.path.samefile(a.path / "rank0.safetensors", b.path / "rank0.safetensors")
    assert len(list(store.objects.iter_objects())) == 2


def test_nested_files_and_reserved_name(store: Store) -> None:
    entry = _commit(store, "repository", "r", {"ensemble/config.pbtxt": b"x", "tensorrt_llm/1/rank0.engine": b"e"})
    assert {f["path"] for f in entry.files} == {"ensemble/config.pbtxt", "tensorrt_llm/1/rank0.engine"}
    from trtpipe.errors import TrtpipeError

    with pytest.raises(TrtpipeError, match="reserves"):
        _commit(store, "engine", "bad", {"manifest.json": b"{}"})
    assert store.get("engine", "bad") is None
    assert not list((store.root / "tmp").iterdir())  # the failed build left nothing


def test_uncommitted_build_is_never_visible(store: Store) -> None:
    with pytest.raises(RuntimeError):
        with store.building("engine", "e1") as b:
            (b.dir / "rank0.engine").write_bytes(b"half")
            assert not (store.root / "engine" / "e1").exists()
            raise RuntimeError("builder crashed")
    assert store.get("engine", "e1") is None
    assert not list((store.root / "tmp").iterdir())


def test_size_change_is_caught_on_reuse_and_entry_moved_aside(store: Store) -> None:
    entry = _commit(store, "engine", "e", {"rank0.engine": b"x" * 100})
    target = entry.path / "rank0.engine"
    target.chmod(0o644)
    target.write_bytes(b"x" * 99)
    assert store.get("engine", "e") is None
    assert not entry.path.exists()
    assert list((store.root / "quarantine").iterdir())


def test_flipped_byte_needs_verify_and_object_is_discarded(store: Store) -> None:
    entry = _commit(store, "engine", "e", {"rank0.engine": bytes(range(256)) * 10})
    digest = entry.files[0]["sha256"]
    obj = store.objects.path_for(digest)
    obj.chmod(0o644)
    with open(obj, "r+b") as handle:  # flip one byte of the stored object (same inode as the entry file)
        handle.seek(77)
        value = handle.read(1)[0]
        handle.seek(77)
        handle.write(bytes([value ^ 0xFF]))
    assert store.get("engine", "e") is not None  # sizes alone cannot see it
    assert store.get("engine", "e", verify=True) is None
    assert not obj.exists()  # the damaged object is gone, so a rebuild cannot link to it
    rebuilt = _commit(store, "engine", "e", {"rank0.engine": bytes(range(256)) * 10})
    assert store.get("engine", "e", verify=True).digest == rebuilt.digest
    assert store.objects.verify(digest)


def test_verify_store_reports_and_quarantines(store: Store) -> None:
    _commit(store, "checkpoint", "good", {"a.bin": b"a" * 64})
    bad = _commit(store, "engine", "bad", {"b.bin": b"b" * 64})
    assert verify_store(store, pins={}).ok
    path = bad.path / "b.bin"
    path.chmod(0o644)
    path.write_bytes(b"c" * 64)
    report = verify_store(store, pins={})
    assert not report.ok
    assert {(p.kind, p.key) for p in report.problems} >= {("engine", "bad")}
    assert report.quarantined == ["engine/bad"]
    assert store.get("checkpoint", "good", verify=True) is not None
    assert verify_store(store, pins={}).ok


def _build_same_key(root: str, queue: multiprocessing.Queue) -> None:
    store = Store.open(Path(root))
    with store.building("checkpoint", "shared") as b:
        if b.existing is not None:
            queue.put(("reused", b.existing.digest))
            return
        time.sleep(0.5)  # hold the lock long enough for the others to queue up behind it
        (b.dir / "w.bin").write_bytes(b"w" * 4096)
        entry = b.commit(inputs={})
        queue.put(("built", entry.digest))


def test_concurrent_builders_of_one_key_wait_then_reuse(store: Store) -> None:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_build_same_key, args=(str(store.root), queue)) for _ in range(4)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
        assert proc.exitcode == 0
    results = [queue.get(timeout=5) for _ in procs]
    assert sorted(r[0] for r in results) == ["built", "reused", "reused", "reused"]
    assert len({r[1] for r in results}) == 1


def test_forced_rebuild_replaces_entry(store: Store) -> None:
    first = _commit(store, "engine", "e", {"x": b"1"})
    with store.building("engine", "e", force=True) as b:
        assert b.existing is None
        (b.dir / "x").write_bytes(b"2")
        second = b.commit(inputs={})
    assert second.digest != first.digest
    assert (store.root / "engine" / "e" / "x").read_bytes() == b"2"


def test_find_by_prefix_kind_and_digest(store: Store) -> None:
    a = _commit(store, "engine", "abcdef01", {"x": b"1"})
    _commit(store, "checkpoint", "abcdff02", {"y": b"2"})
    assert store.find("abcdef").key == "abcdef01"
    assert store.find("engine/abcd").key == "abcdef01"
    assert store.find(a.digest[:20]).key == "abcdef01"
    with pytest.raises(UsageError, match="matches 2"):
        store.find("abcd")
    with pytest.raises(NotFound):
        store.find("zzzz")
    with pytest.raises(UsageError):
        store.entry_dir("engine", "../escape")


def _age(entry, seconds: float) -> None:
    past = time.time() - seconds
    os.utime(entry.path / "manifest.json", (past, past))


def test_gc_lru_by_size_and_age_never_pinned_or_in_use(store: Store) -> None:
    old = _commit(store, "engine", "old", {"x": b"o" * 1000})
    mid = _commit(store, "engine", "mid", {"x": b"m" * 1000})
    new = _commit(store, "engine", "new", {"x": b"n" * 1000})
    pinned = _commit(store, "engine", "pinned", {"x": b"p" * 1000})
    held = _commit(store, "checkpoint", "held", {"x": b"h" * 1000})
    for entry, age in ((old, 40 * 86400), (mid, 20 * 86400), (new, 10), (pinned, 90 * 86400), (held, 90 * 86400)):
        _age(entry, age)
    pins = {pinned.digest: ["tiny/cpu-reference/prod"]}  # what the release area's channels pin

    with store.lease(held):
        dry = gc.collect(store, pins=pins, max_age_s=30 * 86400, dry_run=True)
        assert [a.name for a in dry.removed if a.what == "entry"] == ["engine/old"]
        assert store.peek("engine", "old") is not None  # peek: a get() counts as a use

        report = gc.collect(store, pins=pins, max_age_s=30 * 86400)
        assert [a.name for a in report.removed if a.what == "entry"] == ["engine/old"]
        assert "engine/pinned" in report.kept_pinned and "checkpoint/held" in report.kept_in_use

        report = gc.collect(store, pins=pins, max_size=2500)  # LRU: mid goes first, then new; pinned and held stay
        assert [a.name for a in report.removed if a.what == "entry"] == ["engine/mid", "engine/new"]
    assert {e.key for e in store.entries()} == {"pinned", "held"}
    digests_left = {d for d, _ in store.objects.iter_objects()}
    assert digests_left == {pinned.files[0]["sha256"], held.files[0]["sha256"]}  # orphans removed


def test_gc_removes_leftovers_of_killed_builds_but_not_live_ones(store: Store) -> None:
    stale = store.root / "tmp" / "engine-deadkey-abc123"
    stale.mkdir()
    (stale / "rank0.engine").write_bytes(b"partial")
    with store.building("checkpoint", "live") as b:
        (b.dir / "x").write_bytes(b"writing")
        report = gc.collect(store, pins={})
        assert b.dir.exists()
        assert [a.name for a in report.removed if a.what == "tmp"] == ["engine-deadkey-abc123"]
    assert not stale.exists()


def test_rm_refuses_entry_in_use(store: Store) -> None:
    entry = _commit(store, "engine", "e", {"x": b"1"})
    with store.lease(entry):
        assert store.remove(entry) is False
    assert store.remove(entry) is True
    assert store.get("engine", "e") is None


def test_size_and_age_parsing() -> None:
    assert gc.parse_size("10GB") == 10 * 10**9
    assert gc.parse_size("2GiB") == 2 * 2**30
    assert gc.parse_size("512") == 512
    assert gc.parse_age("30d") == 30 * 86400
    assert gc.parse_age("12h") == 12 * 3600
    with pytest.raises(UsageError):
        gc.parse_size("ten gigs")
    with pytest.raises(UsageError):
        gc.parse_age("30 days")


NON_ROOT_STORE = r"""
import sys
from pathlib import Path
from trtpipe.store import gc
from trtpipe.store.local import Store

store = Store.open(Path(sys.argv[1]))
with store.building("repository", "r") as b:
    (b.dir / "m" / "1").mkdir(parents=True)
    (b.dir / "m" / "1" / "model.py").write_bytes(b"print(1)\n")
    entry = b.commit(inputs={})
for attempt in (lambda: (entry.path / "m" / "1" / "model.py").write_bytes(b"evil"),
                lambda: (entry.path / "m" / "1" / "__pycache__").mkdir()):
    try:
        attempt()
        print("WRITTEN")
    except PermissionError:
        print("refused")
with store.building("repository", "r", force=True) as b:  # a forced rebuild moves the frozen entry out
    (b.dir / "x").write_bytes(b"2")
    again = b.commit(inputs={})
print("removed" if store.remove(again) else "kept")
gc.collect(store, pins={})
root = Path(sys.argv[1])
print(sorted(p.name for folder in ("trash", "repository", "tmp") if (root / folder).is_dir() for p in (root / folder).iterdir()))
"""


def test_a_frozen_entry_refuses_its_owners_writes_and_is_still_removed(tmp_path: Path) -> None:
    """As a non-root owner (root without the capabilities that bypass file modes): writes into an
    entry are refused, and forced rebuilds, removal and gc still work on the frozen folders."""
    import shutil
    import subprocess
    import sys

    prefix: list[str] = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root and setpriv (util-linux) is missing: cannot drop CAP_DAC_OVERRIDE")
        prefix = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search,-fowner", "--"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run([*prefix, sys.executable, "-c", NON_ROOT_STORE, str(tmp_path / "store")],
                            capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:3] == ["refused", "refused", "removed"], result.stdout
    assert result.stdout.split("\n")[3] == "[]"  # nothing left in repository/, trash/ or tmp/
