"""Digests travel with bytes (issue 15): a stage's output is hashed at most once, when it is written; files
linked from verified inputs carry their digests; a stored input is verified through the digest cache for
free; and the digest cache is never fooled by a restored mtime.

Which files are read to be hashed is observed at the one place trtpipe hashes a whole file
(`hashlib.file_digest`, behind `trtpipe.store.objects.sha256_file`); the converter hashes what it writes
as it writes, and hands the digests on."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from trtpipe.pipeline import run_build
from trtpipe.store.local import Store
from trtpipe.settings import Settings

SPEC = """\
name: tiny-travel
model:
  path: {model}
target:
  gpu: cpu-reference
engine:
  max_batch_size: 2
  max_input_len: 32
  max_seq_len: 64
"""


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> Counter:
    """Counter of resolved paths read by `hashlib.file_digest` (every whole-file hash trtpipe does)."""
    seen: Counter = Counter()
    original = hashlib.file_digest

    def counting(fileobj, digest):  # noqa: ANN001
        seen[str(Path(fileobj.name).resolve())] += 1
        return original(fileobj, digest)

    monkeypatch.setattr(hashlib, "file_digest", counting)
    return seen


@pytest.fixture
def model(tiny_llama_dir: Path, tmp_path: Path) -> Path:
    """A private copy of the tiny model (tests here edit its weights), settled past the racy window."""
    import time

    copy = tmp_path / "model"
    subprocess.run(["cp", "-r", str(tiny_llama_dir), str(copy)], check=True)
    old = time.time_ns() - 10**10
    for path in copy.iterdir():
        os.utime(path, ns=(old, old))
    return copy


def _spec(tmp_path: Path, model: Path) -> Path:
    spec = tmp_path / "tiny.yaml"
    spec.write_text(SPEC.format(model=model))
    return spec


def _stored(store: Path, hashed: Counter) -> dict[str, int]:
    """Files of the store (entries, objects, staging) that were hashed, by path relative to the store."""
    root = str(store.resolve()) + os.sep
    return {path[len(root):]: n for path, n in hashed.items() if path.startswith(root)}


def test_a_cold_build_hashes_its_weights_once_and_never_rehashes_what_it_stored(
    tmp_path: Path, model: Path, hashed: Counter
) -> None:
    store = tmp_path / "store"
    report = run_build(_spec(tmp_path, model), store=store, progress=False, settings=Settings.from_env())
    assert report.status == "ok"
    weights = str((model / "model.safetensors").resolve())
    assert hashed[weights] == 1  # the checkpoint key: the model's content, read once
    stored = _stored(store, hashed)
    # Nothing a stage wrote is read twice, and no weight or engine file is read by the store at all: the
    # converter hashed its rank files while writing, the engine and the repository hard-link them.
    assert all(n == 1 for n in stored.values()), stored
    assert not [p for p in stored if p.endswith(".safetensors")], stored
    # What is hashed at commit is only what a stage wrote itself and did not hash: small text files.
    sizes = {p: (store / p).stat().st_size for p in stored if (store / p).exists()}
    assert all(size < 200_000 for size in sizes.values()), sizes
    assert Store(store).get("repository", report.keys["publish"], verify=True) is not None


def test_publish_again_verifies_its_engine_through_the_digest_cache_reading_nothing(
    tmp_path: Path, model: Path, hashed: Counter
) -> None:
    store = tmp_path / "store"
    spec = _spec(tmp_path, model)
    first = run_build(spec, store=store, progress=False, settings=Settings.from_env())
    engine = Path(first.stage("engine").path)
    for attempt in range(3):
        hashed.clear()
        report = run_build(spec, store=store, force=["publish"], progress=False, settings=Settings.from_env())
        assert report.stage("publish").outcome == "built" and report.artifacts == first.artifacts
        read = _stored(store, hashed)
        # The engine (and the checkpoint it links) is vouched for by the digest cache: not one byte of it
        # is read, the first time after the cold build as on every later one.
        assert not [p for p in read if p.startswith("engine/") or p.endswith(".safetensors")], (attempt, read)
        assert not [p for p in hashed if p.startswith(str(model.resolve()))]  # nor the model's files
    assert (engine / "rank0.safetensors").is_file()


def test_gc_of_an_old_entry_keeps_the_digest_cache_vouching_for_the_files_it_shared(
    tmp_path: Path, model: Path, hashed: Counter
) -> None:
    """Removing an entry unlinks inodes other entries share (their ctime moves): the rows move with them."""
    from trtpipe.store import gc

    store = tmp_path / "store"
    spec = _spec(tmp_path, model)
    run_build(spec, store=store, progress=False, settings=Settings.from_env())
    run_build(spec, store=store, force=["publish"], progress=False, settings=Settings.from_env())  # the old repository goes to trash/
    report = gc.collect(Store(store), pins={})
    assert any(a.what == "trash" for a in report.removed)
    hashed.clear()
    run_build(spec, store=store, force=["publish"], progress=False, settings=Settings.from_env())
    assert not [p for p in _stored(store, hashed) if p.endswith(".safetensors")]


def _flip_byte_keep_mtime(path: Path) -> None:
    """Change one byte in place and put mtime back (what `rsync -t --inplace` does): size, mtime and
    inode stay the same; only ctime moves."""
    st = path.stat()
    mode = st.st_mode
    os.chmod(path, 0o644)
    with open(path, "r+b") as handle:
        handle.seek(st.st_size // 2)
        byte = handle.read(1)
        handle.seek(st.st_size // 2)
        handle.write(bytes([byte[0] ^ 0x01]))
    os.chmod(path, mode & 0o777)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (st.st_size, st.st_mtime_ns, st.st_ino)


def test_a_weight_edited_in_place_with_its_mtime_restored_is_rebuilt(tmp_path: Path, model: Path) -> None:
    store = tmp_path / "store"
    spec = _spec(tmp_path, model)
    first = run_build(spec, store=store, progress=False, settings=Settings.from_env())
    _flip_byte_keep_mtime(model / "model.safetensors")
    second = run_build(spec, store=store, progress=False, settings=Settings.from_env())
    outcomes = {s.name: s.outcome for s in second.stages}
    assert outcomes["checkpoint"] == "built", outcomes
    assert second.keys["checkpoint"] != first.keys["checkpoint"]
    assert second.artifacts["checkpoint"] != first.artifacts["checkpoint"]


def test_a_stored_file_edited_in_place_with_its_mtime_restored_is_caught_before_it_is_built_on(
    tmp_path: Path, model: Path
) -> None:
    store = tmp_path / "store"
    spec = _spec(tmp_path, model)
    first = run_build(spec, store=store, progress=False, settings=Settings.from_env())
    engine = Path(first.stage("engine").path)
    _flip_byte_keep_mtime(engine / "config.json")
    os.chmod(engine / "config.json", 0o444)
    report = run_build(spec, store=store, force=["publish"], progress=False, settings=Settings.from_env())
    engine_outcomes = [s.outcome for s in report.stages if s.name == "engine"]
    assert engine_outcomes == ["hit", "built"], report.stages  # reused, caught by its verification, rebuilt
    assert report.stage("publish").outcome == "built"
    assert report.artifacts == first.artifacts  # the damaged engine was set aside and rebuilt, byte for byte
    (reason,) = (store / "quarantine").glob("engine-*.reason.json")
    assert json.loads(reason.read_text())["problems"][0] == {
        "kind": "engine", "key": engine.name, "file": "config.json", "reason": "sha256 mismatch"}


def test_published_files_are_backdated_so_a_same_size_rewrite_is_seen(tmp_path: Path, model: Path) -> None:
    """The store dates a fresh file's mtime back by the racy window when it publishes it, so the digest
    cache remembers it at once; a rewrite (any time later) sets mtime to the present, so it is seen."""
    from trtpipe.store.digest_cache import RACY_WINDOW_NS, DigestCache

    store = Store.open(tmp_path / "store")
    with store.building("engine", "e" * 64) as handle:
        (handle.dir / "config.json").write_bytes(b"a" * 100)
        entry = handle.commit(inputs={})
    path = entry.path / "config.json"
    import time

    assert time.time_ns() - path.stat().st_mtime_ns >= RACY_WINDOW_NS
    cache = DigestCache(store.root / "digests.sqlite")
    assert cache.cached(path) == hashlib.sha256(b"a" * 100).hexdigest()
    os.chmod(path, 0o644)
    path.write_bytes(b"b" * 100)  # at once: same size, within any timestamp tick of the publish
    assert cache.cached(path) is None
    assert store.verify_entry(store.peek("engine", "e" * 64))[0].reason == "sha256 mismatch"
