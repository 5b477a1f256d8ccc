"""Evidence that travels: `trtpipe results export DIGEST... --out BUNDLE` and `trtpipe results import BUNDLE...`.

Workspaces here are real trtpipe workspaces (`--store DIR`); results are recorded through `ResultsLog.record` the
way smoke and bench record them (origin run, with the run's evidence), and every check reads them back through
`ResultsLog.for_digest`, which refuses a chain that is not whole: what promotion gates read.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trtpipe.signing_keys import generate_key, write_key_pair
from trtpipe.results import ResultsLog, result_identity, run_evidence

pytestmark = pytest.mark.timeout(300)

DIGEST = "sha256:" + "a1" * 32
OTHER = "sha256:" + "b2" * 32


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, Path]:
    """A release key pair and a foreign one (PEM files)."""
    out = {}
    for name in ("release", "foreign"):
        write_key_pair(generate_key(), tmp_path / f"{name}.key", tmp_path / f"{name}.pub")
        out[name], out[f"{name}.pub"] = tmp_path / f"{name}.key", tmp_path / f"{name}.pub"
    return out


def record(home: Path, digest: str, kind: str, passed: bool = True, **data) -> None:
    """Record as smoke and bench do: with the run's evidence, the head signed when TRTPIPE_SIGNING_KEY is set."""
    from trtpipe.signing_keys import release_key
    from trtpipe.settings import Settings

    log = ResultsLog(home, release_key(Settings.from_env()))
    log.record(digest, kind, passed, dict(data), evidence=run_evidence(f"trtpipe {kind}", "127.0.0.1:1"))


def identities(home: Path, digest: str) -> list[str]:
    return [result_identity(r.model_dump()) for r in ResultsLog(home).for_digest(digest)]


def export(cli, home: Path, out: Path, *digests: str) -> dict:
    code, stdout, stderr = cli("results", "export", *digests, "--out", str(out), "--store", str(home), "--json")
    assert code == 0, stderr
    return json.loads(stdout)


def import_(cli, home: Path, *bundles: Path, extra: tuple[str, ...] = ()) -> tuple[int, dict | None, str]:
    code, stdout, stderr = cli("results", "import", *map(str, bundles), "--store", str(home), "--json", *extra)
    return code, (json.loads(stdout) if code == 0 else None), stderr


def test_a_bundle_carries_the_results_and_importing_it_twice_is_a_no_op(isolated_home, tmp_path: Path, cli) -> None:
    runner, release = tmp_path / "gpu-runner", tmp_path / "release"
    record(runner, DIGEST, "smoke")
    record(runner, DIGEST, "bench", ttft_p99_ms=12.5)
    record(runner, OTHER, "smoke", passed=False)
    exported = export(cli, runner, tmp_path / "out" / "results.json", DIGEST, OTHER)
    assert exported["records"] == {DIGEST: 2, OTHER: 1} and exported["signed_by"] is None

    code, first, stderr = import_(cli, release, tmp_path / "out" / "results.json")
    assert code == 0, stderr
    assert (first["new"], first["already_present"]) == (3, 0)
    assert [r["kind"] for log in first["logs"] for r in log["new"]] == ["smoke", "bench", "smoke"]
    assert first["bundles"][0]["trust"].startswith("unsigned")
    # The same results, by identity, in the release workspace's own chain (read through the gate's reader).
    assert identities(release, DIGEST) == identities(runner, DIGEST)
    imported = ResultsLog(release).for_digest(DIGEST)
    assert all(r.imported["bundle"] == "results.json" and r.imported["by"] == "release-tester" for r in imported)
    assert imported[1].data == {"ttft_p99_ms": 12.5} and imported[1].evidence["command"] == "trtpipe bench"

    code, again, stderr = import_(cli, release, tmp_path / "out" / "results.json")
    assert code == 0, stderr
    assert (again["new"], again["already_present"]) == (0, 3)
    assert len(ResultsLog(release).for_digest(DIGEST)) == 2  # and the chain is still whole (for_digest checks it)

    # The text form says what was new.
    code, text, _ = cli("results", "import", str(tmp_path / "out" / "results.json"), "--store", str(release))
    assert code == 0 and "0 new, 3 already here" in text


def test_bundles_of_one_digest_from_two_runners_merge(isolated_home, tmp_path: Path, cli) -> None:
    a, b, release = tmp_path / "runner-a", tmp_path / "runner-b", tmp_path / "release"
    record(a, DIGEST, "smoke")
    record(b, DIGEST, "bench", ttft_p99_ms=30.0)
    record(b, DIGEST, "parity")
    export(cli, a, tmp_path / "a.json", DIGEST)
    export(cli, b, tmp_path / "b.json", DIGEST)

    code, merged, stderr = import_(cli, release, tmp_path / "a.json", tmp_path / "b.json")
    assert code == 0, stderr
    assert (merged["new"], merged["already_present"]) == (3, 0) and len(merged["logs"]) == 1
    assert sorted(identities(release, DIGEST)) == sorted(identities(a, DIGEST) + identities(b, DIGEST))

    # Runner A benches again: its next bundle holds the old smoke and the new bench; only the bench is new.
    record(a, DIGEST, "bench", ttft_p99_ms=31.0)
    export(cli, a, tmp_path / "a2.json", DIGEST)
    code, next_run, stderr = import_(cli, release, tmp_path / "b.json", tmp_path / "a2.json")
    assert code == 0, stderr
    assert (next_run["new"], next_run["already_present"]) == (1, 3)  # b: 2 held; a2: its smoke held, its bench new
    assert len(ResultsLog(release).for_digest(DIGEST)) == 4

    # The release workspace's bundle goes back to runner A: A gains B's two results, nothing twice.
    export(cli, release, tmp_path / "release.json", DIGEST)
    code, back, stderr = import_(cli, a, tmp_path / "release.json")
    assert code == 0, stderr
    assert (back["new"], back["already_present"]) == (2, 2)
    assert sorted(identities(a, DIGEST)) == sorted(identities(release, DIGEST))


def _rewrite(bundle: Path, change) -> Path:
    document = json.loads(bundle.read_text())
    change(document)
    out = bundle.with_name("tampered-" + bundle.name)
    out.write_text(json.dumps(document))
    return out


def _rehash(document: dict) -> None:
    """Re-chain every log after an edit and re-anchor its head: what someone covering their tracks does."""
    from trtpipe.chained import GENESIS, record_hash

    for log in document["logs"]:
        prev = GENESIS
        for number, fields in enumerate(log["records"], start=1):
            fields.update(seq=number, prev_hash=prev)
            fields["hash"] = record_hash(fields)
            prev = fields["hash"]
        log["head"].update(records=len(log["records"]), hash=prev)


def _flip_first_smoke(document: dict) -> None:
    document["logs"][0]["records"][0]["passed"] = True


def test_a_tampered_bundle_is_refused_in_one_line_and_nothing_is_imported(isolated_home, tmp_path: Path, cli,
                                                                          keys, monkeypatch) -> None:
    runner, release = tmp_path / "runner", tmp_path / "release"
    record(runner, DIGEST, "smoke", passed=False)
    record(runner, DIGEST, "bench", ttft_p99_ms=9000.0)
    record(runner, DIGEST, "smoke")
    plain = tmp_path / "plain.json"
    export(cli, runner, plain, DIGEST)

    edited = _rewrite(plain, _flip_first_smoke)
    removed = _rewrite(plain, lambda d: d["logs"][0]["records"].pop(1))
    cut = _rewrite(plain, lambda d: d["logs"][0]["records"].pop())
    foreign_digest = _rewrite(plain, lambda d: d["logs"][0]["records"][0].update(artifact_digest=OTHER))
    cases = {edited: "record hash mismatch (the record was edited)", removed: "sequence 3 where 2 was expected",
             cut: "head: anchors 3 records, the chain holds 2", foreign_digest: "record hash mismatch"}
    for bundle, expected in cases.items():
        code, _, stderr = import_(cli, release, plain, bundle)  # a good bundle beside it is not imported either
        lines = stderr.strip().splitlines()
        assert code == 1 and len(lines) == 1, stderr
        assert lines[0].startswith(f"error: {bundle}: ") and expected in lines[0] and "nothing was imported" in lines[0]
    assert not (release / "results").exists() or ResultsLog(release).for_digest(DIGEST) == []

    # A runner with the release key signs its heads and its bundle; the importing workspace knows the key (the
    # setting, or --public-key, or its trust policy).
    monkeypatch.setenv("TRTPIPE_SIGNING_KEY", keys["release"].read_text())
    runner = tmp_path / "signing-runner"
    record(runner, DIGEST, "smoke", passed=False)
    record(runner, DIGEST, "bench", ttft_p99_ms=9000.0)
    record(runner, DIGEST, "smoke")
    signed = tmp_path / "signed.json"
    assert export(cli, runner, signed, DIGEST)["signed_by"]
    # An edit covered by re-chaining and re-anchoring the head is still caught: the signature no longer verifies.
    covered = _rewrite(signed, lambda d: (_flip_first_smoke(d), _rehash(d)))
    code, _, stderr = import_(cli, release, covered)
    assert code == 1 and "does not verify: the bundle was changed after it was signed" in stderr, stderr
    # Unsigned where a key is known: refused.
    code, _, stderr = import_(cli, release, plain)
    assert code == 1 and "the bundle is not signed" in stderr and len(stderr.strip().splitlines()) == 1, stderr
    # Signed by another key (foreign): refused, naming the signer.
    monkeypatch.delenv("TRTPIPE_SIGNING_KEY")
    foreign = tmp_path / "foreign.json"
    code, _, stderr = cli("results", "export", DIGEST, "--out", str(foreign), "--store", str(tmp_path / "runner"),
                          "--sign", str(keys["foreign"]))
    assert code == 0, stderr
    code, _, stderr = import_(cli, release, foreign, extra=("--public-key", str(keys["release.pub"])))
    assert code == 1 and "which this workspace does not trust" in stderr, stderr
    assert not (release / "results").exists() or ResultsLog(release).for_digest(DIGEST) == []

    # The genuine signed bundle imports, checked against the trust policy's key.
    policy = tmp_path / "policy.yaml"
    policy.write_text(f"keys: {{release: {keys['release.pub']}}}\ndefault: {{require_signature: true}}\n")
    code, done, stderr = import_(cli, release, signed, extra=("--policy", str(policy)))
    assert code == 0, stderr
    assert done["new"] == 3 and done["bundles"][0]["trust"].startswith("signed by release (policy")
    # Without any key here, a foreign signature is reported (it verifies), not trusted or refused.
    code, loose, stderr = import_(cli, tmp_path / "laptop", foreign)
    assert code == 0 and "no release key or trust policy here" in loose["bundles"][0]["trust"], stderr


def test_a_damaged_log_here_refuses_the_import(isolated_home, tmp_path: Path, cli) -> None:
    runner, release = tmp_path / "runner", tmp_path / "release"
    record(runner, DIGEST, "smoke")
    record(runner, OTHER, "smoke")
    export(cli, runner, tmp_path / "b.json", DIGEST, OTHER)
    record(release, OTHER, "bench", ttft_p99_ms=1.0)
    damaged = release / "results" / (OTHER.split(":")[1] + ".jsonl")
    damaged.write_text(damaged.read_text().replace('"ttft_p99_ms": 1.0', '"ttft_p99_ms": 0.5'))
    code, _, stderr = import_(cli, release, tmp_path / "b.json")
    assert code == 1 and damaged.name in stderr and "none of the results" in stderr, stderr
    # Refused before anything was appended, for the intact digest too.
    assert ResultsLog(release).for_digest(DIGEST) == []


def test_export_refuses_what_it_cannot_vouch_for(isolated_home, tmp_path: Path, cli) -> None:
    runner = tmp_path / "runner"
    code, _, stderr = cli("results", "export", DIGEST, "--out", str(tmp_path / "x.json"), "--store", str(runner))
    assert code == 2 and "no results are recorded for" in stderr and not (tmp_path / "x.json").exists()
    record(runner, DIGEST, "smoke")
    log = runner / "results" / (DIGEST.split(":")[1] + ".jsonl")
    log.write_text(log.read_text() + log.read_text())  # appended outside trtpipe
    code, _, stderr = cli("results", "export", DIGEST, "--out", str(tmp_path / "x.json"), "--store", str(runner))
    assert code == 1 and log.name in stderr and not (tmp_path / "x.json").exists(), stderr


def test_two_imports_of_one_bundle_at_once_append_each_record_once(isolated_home, tmp_path: Path, cli) -> None:
    runner, release = tmp_path / "runner", tmp_path / "release"
    for n in range(20):
        record(runner, DIGEST, "bench", ttft_p99_ms=float(n))
    bundle = tmp_path / "b.json"
    export(cli, runner, bundle, DIGEST)
    command = [sys.executable, "-m", "trtpipe.cli", "results", "import", str(bundle), "--store", str(release), "--json"]
    procs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=240) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outs]
    news = sorted(json.loads(out)["new"] for out, _ in outs)
    assert news == [0, 20]  # one import merged everything, the other found it all there
    assert identities(release, DIGEST) == identities(runner, DIGEST)
