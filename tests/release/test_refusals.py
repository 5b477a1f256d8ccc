"""Issue 23: a refused promote or rollback, as a CI step reads it. With --json, a JSON object on stdout (`ok` false,
the error, every gate's verdict) as well as the one line on stderr; and that line says each thing once.

As found: a refused `promote --json` printed nothing on stdout (the verdicts were only in one 621-character stderr
line), and for a regression that line said "record results" twice, although the results existed and regressed.
"""

from __future__ import annotations

import json

import pytest

from trtpipe.results import ResultsLog

pytestmark = pytest.mark.timeout(120)

GATES = {"prod": {"smoke": True, "parity": True, "bench": {"ttft_p99_ms": 200, "min_output_tokens_per_s": 50},
                  "max_regression_pct": 10}}


def _refusal(out: str, err: str) -> tuple[dict, str]:
    (line,) = [l for l in err.splitlines() if l.strip()]
    refusal = json.loads(out)
    assert refusal["ok"] is False and refusal["error"]["stderr"] == line
    return refusal, line


def test_missing_results_refusal_is_json_with_every_verdict_and_says_record_once(isolated_home, store_entry,
                                                                                 cli) -> None:
    entry = store_entry(isolated_home, "d1" * 8, seed="d", gates=GATES)
    ResultsLog(isolated_home).record(entry.digest, "smoke", True, {})
    code, out, err = cli("promote", entry.digest, "--to", "prod", "--json")
    assert code == 1
    refusal, line = _refusal(out, err)
    assert refusal["exit_code"] == 1 and refusal["error"]["type"] == "GateRefused"
    fields = refusal["error"]["fields"]
    assert fields["digest"] == entry.digest and fields["channel"] == "prod"
    # Prod is empty: no regression. Each bench bound is its own gate, judged on every bench run of the digest.
    bench_gates = {"bench.ttft_p99_ms", "bench.min_output_tokens_per_s"}
    assert set(fields["failed"]) == set(fields["missing"]) == {"parity"} | bench_gates
    verdicts = {v["gate"]: v["status"] for v in refusal["verdicts"]}
    assert verdicts["smoke"] == "passed" and verdicts["parity"] == "missing"
    assert {verdicts[gate] for gate in bench_gates} == {"missing"}
    # Said once: what to record, then the commands that record it, then the override.
    assert refusal["error"]["fix"].startswith("record ") and "parity" in refusal["error"]["fix"]
    assert line.count("for exactly this digest") == 1 and line.count("--record REPO") == 2
    assert "record results for exactly" not in line and line.count("--force") == 1


def test_a_regression_refusal_does_not_ask_for_results_that_exist(isolated_home, store_entry, cli) -> None:
    base = store_entry(isolated_home, "e2" * 8, seed="e", gates=GATES)
    cand = store_entry(isolated_home, "f3" * 8, seed="f", gates=GATES)
    log = ResultsLog(isolated_home)
    for entry, ttft in ((base, 100.0), (cand, 130.0)):
        log.record(entry.digest, "smoke", True, {})
        log.record(entry.digest, "parity", True, {"max_abs_logit_diff": 0.0})
        for noise in (-1.0, 0.0, 1.0, 0.5, -0.5):  # a bench gate judges repeated runs (TRTPIPE_MIN_BENCH_RUNS: 3)
            log.record(entry.digest, "bench", True, {"ttft_p99_ms": ttft + noise, "output_tokens_per_s": 80.0},
                       gpu_class="cpu-reference")
    assert cli("promote", base.digest, "--to", "prod")[0] == 0
    code, out, err = cli("promote", cand.digest, "--to", "prod", "--json")
    assert code == 1
    refusal, line = _refusal(out, err)
    failed = {v["gate"] for v in refusal["verdicts"] if v["status"] != "passed"}
    assert failed == set(refusal["error"]["fields"]["failed"]) and any(g.startswith("regression") for g in failed)
    assert refusal["error"]["fields"]["missing"] == []
    assert {v["gate"]: v["status"] for v in refusal["verdicts"]}["smoke"] == "passed"
    # The results exist and did not pass: no "record results", once or twice; what to look at and how to override.
    assert "record passing results" not in line and "--record" not in line and "record results" not in line
    assert line.count("fix what failed or regressed") == 1 and "regressed beyond it" in line
    assert f"`trtpipe results show {cand.digest}`" in line
    assert line.count("--force") == 1
    # The same refusal without --json: the same line, nothing on stdout.
    code, out, err = cli("promote", cand.digest, "--to", "prod")
    assert code == 1 and out == "" and err.strip() == line


def test_a_refused_rollback_with_json_is_a_json_object_on_stdout(isolated_home, store_entry, cli) -> None:
    entry = store_entry(isolated_home, "a4" * 8, seed="a")
    ResultsLog(isolated_home).record(entry.digest, "smoke", True, {})
    assert cli("promote", entry.digest, "--to", "staging")[0] == 0
    code, out, err = cli("rollback", "staging", "--json")
    assert code == 2
    refusal, line = _refusal(out, err)
    assert refusal["exit_code"] == 2 and refusal["error"]["type"] == "NotFound" and refusal["verdicts"] is None
    assert refusal["error"]["fields"]["what"] == "earlier digest" and "no earlier digest" in line
