"""ResultsLog: validated, append-only, per digest, safe under concurrent writers."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from trtpipe.errors import UsageError
from trtpipe.results import ResultsLog

pytestmark = pytest.mark.timeout(60)

DIGEST = "sha256:" + "ab" * 32


def _append_many(home: str, worker: int) -> None:
    log = ResultsLog(Path(home))
    for i in range(40):
        log.record(DIGEST, "bench", True, {"worker": worker, "i": i, "pad": "x" * 2000}, gpu_class="cpu-reference")


def test_record_and_read_back(tmp_path: Path) -> None:
    log = ResultsLog(tmp_path)
    rec = log.record(DIGEST.removeprefix("sha256:"), "smoke", True, {"checks": 6})
    assert rec.artifact_digest == DIGEST
    assert [r.kind for r in log.for_digest(DIGEST)] == ["smoke"]
    assert log.for_digest("sha256:" + "cd" * 32) == []
    assert (tmp_path / "results" / ("ab" * 32 + ".jsonl")).is_file()


@pytest.mark.parametrize(
    "digest, kind, data",
    [("sha256:xyz", "smoke", {}), (DIGEST, "latency", {}), (DIGEST, "bench", {"not-json": object()})],
)
def test_invalid_records_are_refused(tmp_path: Path, digest: str, kind: str, data: dict) -> None:
    with pytest.raises(UsageError):
        ResultsLog(tmp_path).record(digest, kind, True, data)
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").glob("*.jsonl"))


def test_concurrent_writers_never_interleave(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_append_many, args=(str(tmp_path), w)) for w in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    records = ResultsLog(tmp_path).for_digest(DIGEST)
    assert len(records) == 120
    assert {(r.data["worker"], r.data["i"]) for r in records} == {(w, i) for w in range(3) for i in range(40)}
