"""Disk full during a build (issue 14), reproduced as the issue found it: the store on a small tmpfs.

On main, 4 of 4 sizes ended in raw tracebacks (`sqlite3.OperationalError: disk I/O error`, `database or disk
is full`, `SafetensorError ... No space left on device (os error 28)`) or a line naming no path, and no build
record said what happened. Now every one is one line naming the path written, the stage, what it had written
or needs and what is free, exit 1, no traceback; nothing half-written stays (the store's tmp/ is empty and
`cache verify` passes on whatever was stored); and the build record says status failed, the stage and the
reason, or the error line says the record could not be written either (a disk with no byte free).

Each build runs in its own mount namespace (`unshare --mount`, or `--user --map-root-user` when not root), so
the tmpfs disappears with it and the host's mounts are untouched. The tmpfs sizes come from a reference build
in the same test (what the tiny model's whole store takes on tmpfs), not from constants.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trtpipe.disk import disk_full, disk_full_error
from trtpipe.errors import DiskFull

LIMITS = "engine: {max_batch_size: 4, max_input_len: 64, max_seq_len: 128}\n"


def _unshare() -> list[str]:
    return ["unshare", "--mount", "--propagation", "private"] if os.geteuid() == 0 else \
        ["unshare", "--user", "--map-root-user", "--mount"]


def _can_mount_tmpfs(tmp_path: Path) -> str | None:
    if shutil.which("unshare") is None:
        return "needs unshare (util-linux)"
    probe = tmp_path / "probe"
    probe.mkdir()
    result = subprocess.run([*_unshare(), "sh", "-c", f"mount -t tmpfs -o size=16k tmpfs {probe}"],
                            capture_output=True, text=True)
    if result.returncode != 0:
        return f"cannot mount a tmpfs in a mount namespace here ({result.stderr.strip()})"
    return None


def build_on_tmpfs(tmp_path: Path, spec: Path, size: str, name: str) -> dict:
    """`trtpipe build SPEC --json` with its store on a tmpfs of `size` in a private mount namespace; then, in the
    same namespace, `cache verify` and a copy of what the store holds (the tmpfs goes with the namespace)."""
    mnt, out = tmp_path / f"mnt-{name}", tmp_path / f"out-{name}"
    mnt.mkdir()
    out.mkdir()
    store = mnt / "store"
    cli = f"{shlex.quote(sys.executable)} -m trtpipe.cli"
    script = f"""
        mount -t tmpfs -o size={size} tmpfs {mnt} || exit 97
        {cli} build {spec} --json --store {store} > {out}/stdout 2> {out}/stderr
        echo $? > {out}/rc
        {cli} cache verify --json --store {store} > {out}/verify.json 2> {out}/verify.err
        echo $? > {out}/verify.rc
        ls -A {store}/tmp > {out}/tmp.txt 2>/dev/null
        cp -r {store}/records {out}/records 2>/dev/null
        ls {store}/checkpoint {store}/engine {store}/repository > {out}/entries.txt 2>/dev/null
        df -B1 --output=used,size {mnt} | tail -1 > {out}/df.txt
    """
    proc = subprocess.run([*_unshare(), "sh", "-c", script], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode != 97, proc.stderr
    records = sorted((out / "records").glob("*.json")) if (out / "records").is_dir() else []
    used, total = (int(x) for x in (out / "df.txt").read_text().split())
    return {
        "rc": int((out / "rc").read_text()),
        "stdout": (out / "stdout").read_text(),
        "stderr": (out / "stderr").read_text(),
        "verify_rc": int((out / "verify.rc").read_text()),
        "verify": (out / "verify.json").read_text(),
        "tmp": (out / "tmp.txt").read_text().split() if (out / "tmp.txt").exists() else [],
        "records": [json.loads(p.read_text()) for p in records],
        "used": used,
        "total": total,
        "mnt": mnt,
    }


@pytest.mark.timeout(1800)
def test_a_build_on_a_full_disk_is_one_line_and_leaves_nothing_half_written(tiny_llama_dir: Path, tmp_path: Path) -> None:
    why = _can_mount_tmpfs(tmp_path)
    if why:
        pytest.skip(why)
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"name: tiny\nmodel:\n  path: {tiny_llama_dir}\n  dtype: float16\ntarget:\n  gpu: cpu-reference\n{LIMITS}")
    reference = build_on_tmpfs(tmp_path, spec, "64m", "reference")
    assert reference["rc"] == 0, reference["stderr"]
    full = reference["used"]  # what the whole build takes on tmpfs (pages, SQLite's file, records)
    assert json.loads(reference["stdout"])["status"] == "ok"
    cases = {
        # no room for the digest cache's first page: SQLite's "disk I/O error" / "database or disk is full"
        "first-write": "16k",
        # room for the digest cache, not for the checkpoint's weights: safetensors' "os error 28"
        "checkpoint": str(full // 3),
        # room for nearly all of it: the last stage or the record runs out
        "late": str(full - 48 * 1024),
    }
    stages_failed = set()
    for name, size in cases.items():
        result = build_on_tmpfs(tmp_path, spec, size, name)
        err = result["stderr"]
        assert result["rc"] == 1, (name, err)
        assert "Traceback" not in err and "Error:" not in err.replace("error:", ""), (name, err)
        lines = [x for x in err.splitlines() if x.strip()]
        assert len(lines) == 1, (name, err)
        line = lines[0]
        assert line.startswith("error: no space left on device writing " + str(result["mnt"])), (name, line)
        assert " free of " in line and "nothing was half-written" in line, (name, line)
        # nothing half-written: no build left in tmp/, and what was stored verifies
        assert result["tmp"] == [], (name, result["tmp"])
        assert result["verify_rc"] == 0, (name, result["verify"])
        # the build record says what happened, or the line says it could not be written
        if result["records"]:
            record = result["records"][-1]
            # the record holds the error; the CLI's line adds a command hint after it
            assert record["status"] == "failed" and line.removeprefix("error: ").startswith(record["error"]), \
                (name, record)
            assert "trtpipe cache gc --max-size SIZE" in line
            failed = [s["name"] for s in record["stages"] if s["outcome"] == "failed"]
            assert len(failed) == 1 and f"(the {failed[0]} stage" in line, (name, record["stages"])
            stages_failed.add(failed[0])
        else:
            assert "the build record could not be written either" in line, (name, line)
    assert "checkpoint" in stages_failed  # the safetensors case was reached and recorded


def test_the_checkpoint_case_names_what_was_needed(tiny_llama_dir: Path, tmp_path: Path) -> None:
    """The line quotes the plan's estimate of the checkpoint (weights at fp16) as what the stage needs."""
    why = _can_mount_tmpfs(tmp_path)
    if why:
        pytest.skip(why)
    from trtpipe.plan import memory_plan
    from trtpipe.resolve import resolve
    from trtpipe.spec_loader import load_spec

    spec = tmp_path / "spec.yaml"
    spec.write_text(f"name: tiny\nmodel:\n  path: {tiny_llama_dir}\n  dtype: float16\ntarget:\n  gpu: cpu-reference\n{LIMITS}")
    weights = memory_plan(resolve(load_spec(spec))).weight_bytes_total
    result = build_on_tmpfs(tmp_path, spec, "1m", "needed")
    line = result["stderr"].strip()
    assert result["rc"] == 1 and "(the checkpoint stage had written" in line, line
    assert f"needs about {weights / 2**20:.1f} MiB in all" in line and f"free at least {weights / 2**20:.1f} MiB" in line
    record = result["records"][-1]
    assert record["status"] == "failed"
    assert [s["outcome"] for s in record["stages"]] == ["ran", "ran", "failed", "skipped", "skipped"]


@pytest.mark.parametrize("exc", [
    OSError(28, "No space left on device", "/store/tmp/x"),
    OSError(122, "Disk quota exceeded"),
    RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)"),  # safetensors' text
    __import__("sqlite3").OperationalError("database or disk is full"),
])
def test_every_way_a_library_says_disk_full_is_recognised(exc: BaseException) -> None:
    assert disk_full(exc)
    wrapped = ValueError("ModelOpt export failed")
    wrapped.__context__ = exc  # a library error raised while handling it (`raise ... from None` keeps this)
    assert disk_full(wrapped)
    err = disk_full_error(exc, "/store", stage="checkpoint")
    assert isinstance(err, DiskFull) and err.exit_code == 1 and "\n" not in err.one_line()


def test_other_failures_are_not_called_disk_full(tmp_path: Path) -> None:
    assert not disk_full(OSError(13, "Permission denied"))
    assert not disk_full(RuntimeError("shape mismatch"))
    # SQLite's ambiguous "disk I/O error" is disk full only where the disk has almost nothing free
    assert not disk_full(__import__("sqlite3").OperationalError("disk I/O error"), tmp_path)
