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


# --------------------------------------------------------------------------- forged results under a policy (issue 28)


def _signed_entry(home: Path, store_entry, key, name: str, seed: str):
    """A store entry signed by `key` as a keyed push leaves it (its bundle kept beside the entry)."""
    from trtpipe.release.trust import sign_entry
    from trtpipe.store import signatures

    entry = store_entry(home, name * 64, seed=seed, gates={"staging": {"smoke": True}})
    bundle = sign_entry(entry, key, home / "tmp")
    signatures.update_record(home, entry.digest, kind=entry.kind, key=entry.key,
                             bundles=[{"bundle": bundle.decode(), "claimed_key_id": key.key_id}])
    return entry


def test_a_forged_run_result_does_not_satisfy_a_gate_under_the_policy(isolated_home: Path, tmp_path: Path, store_entry,
                                                                       cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """Attack 6: ten lines through ChainedLog.append, without the key, write an `origin: run` smoke result with
    made-up evidence and rewrite the head. Under a policy that requires signatures for staging, a result counts
    only when a head signed by a trusted key covers it: the forged one does not, a genuine one does."""
    from trtpipe.chained import ChainedLog
    from trtpipe import signing_keys as K
    from trtpipe.signing_keys import ReleaseKey
    from trtpipe.results import ResultRecord

    key = K.generate_key()
    K.write_key_pair(key, tmp_path / "release.key", tmp_path / "release.pub")
    policy = tmp_path / "policy.yaml"
    policy.write_text(f"keys:\n  release: {tmp_path / 'release.pub'}\ndefault:\n  require_signature: true\n")
    monkeypatch.delenv("TRTPIPE_SIGNING_KEY", raising=False)

    forged_for = _signed_entry(isolated_home, store_entry, key, "f", "forged")
    forged = ResultRecord(artifact_digest=forged_for.digest, kind="smoke", passed=True, data={"checks": 6},
                          gpu_class="cpu-reference", origin="run",
                          evidence={"command": "trtpipe smoke", "server_url": "http://127.0.0.1:8000", "host": "ci"})
    (isolated_home / "results").mkdir(exist_ok=True)
    ChainedLog(isolated_home / "results" / (forged_for.digest.split(":", 1)[1] + ".jsonl"), what="result log").append(
        forged.model_dump(mode="json", exclude={"seq", "prev_hash", "hash"}))
    assert [r.origin for r in ResultsLog(isolated_home).for_digest(forged_for.digest)] == ["run"]  # it reads as a run

    code, _, err = cli("promote", forged_for.digest, "--to", "staging", "--policy", str(policy))
    assert code != 0, err
    assert "smoke" in err and "not covered by a results-log head signed by a key" in err, err
    # A policy that says unsigned results may count for staging lets it through (the operator's choice, said).
    lax = tmp_path / "lax.yaml"
    lax.write_text(policy.read_text() + "channels:\n  staging: {unsigned_results: allow}\n")
    code, out, err = cli("promote", forged_for.digest, "--to", "staging", "--policy", str(lax), "--dry-run")
    assert code == 0 and "dry run: would be promoted to staging" in out, err

    # The genuine flow: the smoke result recorded with the release key set signs the head; it counts.
    genuine_for = _signed_entry(isolated_home, store_entry, key, "g", "genuine")
    ResultsLog(isolated_home, ReleaseKey(key)).record(genuine_for.digest, "smoke", True, {"checks": 6},
                                                      gpu_class="cpu-reference", evidence={"command": "trtpipe smoke"})
    code, _, err = cli("promote", genuine_for.digest, "--to", "staging", "--policy", str(policy))
    assert code == 0, err
