"""The store survives its own damage (issue 14): a damaged manifest.json, a damaged channel state or trail,
a garbage digest cache, a stored file that is not a file. Each is reproduced the way it was found, then
the answer is checked: one line (no traceback), the exit code, the entry set aside, nothing pinned lost."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from trtpipe.cli import main
from trtpipe.store.local import Store
from trtpipe.settings import Settings

SPEC = """\
name: tiny-damage
model:
  path: {model}
target:
  gpu: cpu-reference
engine:
  max_batch_size: 2
  max_input_len: 32
  max_seq_len: 64
"""


@pytest.fixture(scope="module")
def pristine(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A store holding the tiny spec's three entries, and the digests the build reported."""
    from trtpipe.pipeline import run_build

    base = tmp_path_factory.mktemp("damage")
    spec = base / "tiny.yaml"
    spec.write_text(SPEC.format(model=tiny_llama_dir))
    report = run_build(spec, store=base / "store", progress=False, settings=Settings.from_env())
    return base, dict(report.artifacts)


@pytest.fixture
def home(pristine: tuple[Path, dict[str, str]], tmp_path: Path) -> Path:
    """A copy of the pristine store (hard links kept, as in a real store)."""
    base, _ = pristine
    target = tmp_path / "store"
    subprocess.run(["cp", "-a", str(base / "store"), str(target)], check=True)
    return target


def _spec(pristine: tuple[Path, dict[str, str]]) -> str:
    return str(pristine[0] / "tiny.yaml")


def _entry_dir(home: Path, kind: str) -> Path:
    (path,) = (home / kind).iterdir()
    return path


def _write_manifest(entry_dir: Path, data: bytes) -> None:
    os.chmod(entry_dir, 0o755)
    manifest = entry_dir / "manifest.json"
    os.chmod(manifest, 0o644)
    manifest.write_bytes(data)
    os.chmod(manifest, 0o444)
    os.chmod(entry_dir, 0o555)


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# Each way a manifest.json was found damaged, from the original bytes (and the parsed manifest).
DAMAGES = {
    "truncated": lambda raw, m: raw[: len(raw) // 2],
    "empty": lambda raw, m: b"",
    "files null": lambda raw, m: json.dumps({**m, "files": None}).encode(),
    "files of numbers": lambda raw, m: json.dumps({**m, "files": [1, 2]}).encode(),
    "path null": lambda raw, m: json.dumps({**m, "files": [{"path": None}]}).encode(),
    "size a string": lambda raw, m: json.dumps({**m, "files": [{**m["files"][0], "size": "big"}]}).encode(),
    "sha256 a number": lambda raw, m: json.dumps({**m, "files": [{**m["files"][0], "sha256": 5}]}).encode(),
    "path escapes": lambda raw, m: json.dumps({**m, "files": [{**m["files"][0], "path": "../../x"}]}).encode(),
    "a list": lambda raw, m: b"[1, 2]",
    "not UTF-8": lambda raw, m: b"\xff\xfe\x00",
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_manifest_never_crashes_a_command_and_is_quarantined(
    damage: str, home: Path, pristine: tuple[Path, dict[str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    engine = _entry_dir(home, "engine")
    raw = (engine / "manifest.json").read_bytes()
    _write_manifest(engine, DAMAGES[damage](raw, json.loads(raw)))

    code, out, err = _run(capsys, "cache", "ls", "--json", "--store", str(home))
    assert code == 0, err
    (row,) = [r for r in json.loads(out) if r["kind"] == "engine"]
    assert row["damage"] and row["files"] == 0 and "Traceback" not in err
    code, _, err = _run(capsys, "cache", "ls", "--store", str(home))
    assert code == 0 and f"damaged engine/{engine.name}: manifest.json: " in err

    code, out, err = _run(capsys, "cache", "verify", "--json", "--store", str(home))
    assert code == 1, err
    result = json.loads(out)
    assert result["quarantined"] == [f"engine/{engine.name}"]
    assert [p["file"] for p in result["problems"]] == ["manifest.json"]
    assert not engine.exists()

    code, _, err = _run(capsys, "cache", "gc", "--store", str(home))
    assert code == 0, err

    # The next build rebuilds exactly the engine it had (content-only digests), and reuses the rest.
    code, out, err = _run(capsys, "build", _spec(pristine), "--json", "--store", str(home))
    assert code == 0, err
    report = json.loads(out)
    outcomes = {s["name"]: s["outcome"] for s in report["stages"]}
    assert outcomes["checkpoint"] == "hit" and outcomes["engine"] == "built" and outcomes["publish"] == "hit"
    assert report["artifacts"] == pristine[1]


def test_build_sets_a_damaged_manifest_aside_and_rebuilds(
    home: Path, pristine: tuple[Path, dict[str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    engine = _entry_dir(home, "engine")
    raw = (engine / "manifest.json").read_bytes()
    _write_manifest(engine, raw[:100])
    code, out, err = _run(capsys, "build", _spec(pristine), "--json", "--store", str(home))
    assert code == 0, err
    assert json.loads(out)["artifacts"] == pristine[1]
    (reason,) = (home / "quarantine").glob("engine-*.reason.json")
    assert json.loads(reason.read_text())["problems"][0]["file"] == "manifest.json"


def _pin_repository(home: Path, digest: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "promote", digest, "--to", "dev", "--force", "--reason", "test", "--store", str(home))
    assert code == 0, err


def test_a_pinned_entry_with_a_damaged_manifest_is_kept_and_restored_to_its_digest(
    home: Path, pristine: tuple[Path, dict[str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    digest = pristine[1]["repository"]
    _pin_repository(home, digest, capsys)
    repository = _entry_dir(home, "repository")
    _write_manifest(repository, b'{"files": null}')

    # gc with every limit at zero: the damaged pinned entry is set aside, and its copy kept.
    code, out, err = _run(capsys, "cache", "gc", "--max-age", "0s", "--json", "--store", str(home))
    assert code == 0, err
    report = json.loads(out)
    assert report["quarantined"] and report["kept_maybe_pinned"]
    (kept,) = report["kept_maybe_pinned"]
    code, out, err = _run(capsys, "cache", "gc", "--max-age", "0s", "--store", str(home))
    assert code == 0 and f"kept {kept}: its manifest is unreadable" in out
    assert (home / kept).is_dir()

    # verify names the channel and the digest its build record gives the damaged entry; repair restores it.
    code, out, err = _run(capsys, "cache", "verify", "--json", "--store", str(home))
    assert code == 1
    (pinned,) = json.loads(out)["pinned"]
    assert pinned["digest"] == digest and pinned["channels"] == ["tiny-damage/cpu-reference/dev"]
    code, out, err = _run(capsys, "cache", "verify", "--repair", "--json", "--store", str(home))
    assert code == 0, err
    assert Store(home).healthy("repository", repository.name, digest) is not None
    # Restored: the damaged copy is no longer needed, and goes.
    code, out, _ = _run(capsys, "cache", "gc", "--json", "--store", str(home))
    assert code == 0 and json.loads(out)["kept_maybe_pinned"] == {}
    assert not (home / kept).exists()


# Each way the channel state file (the trail's projection) was found damaged: gc rebuilds it from the trail
# and keeps what the channels pin.
def _garbage(path: Path) -> None:
    path.write_bytes(b"\x8b\x00garbage{")


def _truncated(path: Path) -> None:
    path.write_text(path.read_text()[:30])


def _dangling(path: Path) -> None:
    path.unlink()
    path.symlink_to(path.parent / "nowhere.json")


def _a_folder(path: Path) -> None:
    path.unlink()
    path.mkdir()


def _not_a_digest(path: Path) -> None:
    data = json.loads(path.read_text())
    data["channels"][0]["digest"] = "sha256:NOPE"
    path.write_text(json.dumps(data))


def _emptied(path: Path) -> None:
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "channels": []}))  # pins nothing, stamp not recomputed


def _removed(path: Path) -> None:
    path.unlink()


STATE_DAMAGES = {f.__name__.strip("_"): f for f in (_garbage, _truncated, _dangling, _a_folder, _not_a_digest, _emptied,
                                                    _removed)}


@pytest.mark.parametrize("damage", sorted(STATE_DAMAGES))
def test_gc_rebuilds_a_damaged_channel_state_from_the_trail_and_keeps_what_it_pins(
    damage: str, home: Path, pristine: tuple[Path, dict[str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    _pin_repository(home, pristine[1]["repository"], capsys)
    STATE_DAMAGES[damage](home / "channels" / "state.json")
    code, out, err = _run(capsys, "cache", "gc", "--max-age", "0s", "--max-size", "0", "--json", "--store", str(home))
    assert code == 0, err
    pinned = "repository/" + _entry_dir(home, "repository").name
    assert pinned in json.loads(out)["kept_pinned"] and (home / pinned).is_dir()


@pytest.mark.parametrize("damage", ["garbage-line", "empty-line"])
def test_gc_stops_at_a_trail_it_cannot_read_and_deletes_nothing(
    damage: str, home: Path, pristine: tuple[Path, dict[str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    from trtpipe.release.audit import audit_path

    _pin_repository(home, pristine[1]["repository"], capsys)
    trail = audit_path(home)
    text = trail.read_text()
    trail.write_text(text + "\x8b garbage{\n" if damage == "garbage-line" else "\n" + text)
    before = sorted(str(p) for p in home.rglob("*") if "channels" not in p.parts)

    code, out, err = _run(capsys, "cache", "gc", "--max-age", "0s", "--max-size", "0", "--store", str(home))
    assert code == 1 and out == ""
    line = err.strip()
    assert len(line.splitlines()) == 1 and line.startswith("error: ") and "Traceback" not in line
    assert str(trail) in line and "edited by hand" in line
    after = sorted(str(p) for p in home.rglob("*") if "channels" not in p.parts)
    assert after == before  # not one file removed, pinned or not


def test_the_lock_temp_files_and_old_pointer_files_are_not_channels(
    home: Path, pristine: tuple[Path, dict[str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    _pin_repository(home, pristine[1]["repository"], capsys)
    channels = home / "channels"
    (channels / ".state.json.abc123.tmp").write_text("{half a sta")  # a rebuild killed mid-write
    legacy = channels / "tiny-damage" / "cpu-reference" / "dev.json"  # a pointer file from before the projection
    legacy.parent.mkdir(parents=True)
    legacy.write_bytes(b"\x8b\x00garbage{")
    code, out, err = _run(capsys, "cache", "gc", "--max-age", "0s", "--json", "--store", str(home))
    assert code == 0, err
    assert "repository/" + _entry_dir(home, "repository").name in json.loads(out)["kept_pinned"]


DB_DAMAGES = {
    "garbage": lambda db: db.write_bytes(os.urandom(8192)),
    "truncated": lambda db: os.truncate(db, 3000),
    "table of another shape": lambda db: _other_table(db),
    "a folder": lambda db: (db.unlink(), db.mkdir()),
}


def _other_table(db: Path) -> None:
    import sqlite3

    with sqlite3.connect(db) as conn:
        conn.execute("DROP TABLE file_digests")
        conn.execute("CREATE TABLE file_digests(x)")


@pytest.mark.parametrize("damage", sorted(DB_DAMAGES))
def test_a_garbage_digest_cache_is_rebuilt_and_said_once(
    damage: str, home: Path, pristine: tuple[Path, dict[str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    db = home / "digests.sqlite"
    for extra in ("digests.sqlite-wal", "digests.sqlite-shm"):
        (home / extra).unlink(missing_ok=True)
    DB_DAMAGES[damage](db)
    code, out, err = _run(capsys, "build", _spec(pristine), "--force", "engine", "--json", "--store", str(home))
    assert code == 0, err
    assert "Traceback" not in err and "DatabaseError" not in err
    warnings = [line for line in err.splitlines() if "digest cache" in line]
    assert len(warnings) == 1 and warnings[0].startswith(f"warning: the digest cache {db} was damaged")
    assert json.loads(out)["artifacts"] == pristine[1]
    assert db.is_file()
    code, _, err = _run(capsys, "build", _spec(pristine), "--force", "engine", "--store", str(home))
    assert code == 0 and "digest cache" not in err  # rebuilt: said once, not on every run


def test_a_stored_file_that_is_not_a_file_is_damage_never_a_hang(
    home: Path, pristine: tuple[Path, dict[str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    engine = _entry_dir(home, "engine")
    os.chmod(engine, 0o755)
    (engine / "config.json").unlink()
    os.mkfifo(engine / "config.json")  # opening it for reading would block forever
    code, out, err = _run(capsys, "cache", "verify", "--json", "--store", str(home))
    assert code == 1
    problems = json.loads(out)["problems"]
    assert {"kind": "engine", "key": engine.name, "file": "config.json", "reason": "not a regular file"} in problems
    code, out, err = _run(capsys, "build", _spec(pristine), "--json", "--store", str(home))
    assert code == 0 and json.loads(out)["artifacts"] == pristine[1]


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root to drop to another user")
def test_an_unreadable_stored_file_is_named_with_the_repair(
    home: Path, pristine: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    """As another user (root reads anything): a stored file that cannot be read is damage, named, one line."""
    import sys

    engine = _entry_dir(home, "engine")
    for path in [tmp_path, *tmp_path.parents]:
        if path == Path("/"):
            break
        os.chmod(path, os.stat(path).st_mode | 0o005)  # let the other user reach the store
    for folder, dirs, files in os.walk(home):
        os.chown(folder, 65534, 65534)
        for name in files:
            os.lchown(os.path.join(folder, name), 65534, 65534)
    os.chmod(engine / "rank0.safetensors", 0)  # shared with the checkpoint and objects: one inode
    env = {**os.environ, "HOME": str(tmp_path), "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m", "trtpipe.cli",
         "cache", "verify", str(f"engine/{engine.name}"), "--store", str(home)],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert f"CORRUPT engine/{engine.name} rank0.safetensors: unreadable (Permission denied)" in result.stderr
    assert "trtpipe cache verify --repair" in result.stderr
    assert stat.S_IMODE(os.lstat(home / "objects").st_mode)  # the store is still there
