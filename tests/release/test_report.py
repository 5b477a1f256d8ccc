"""`trtpipe report`: the release page, rendered from a real workspace and opened in headless Chromium.

The workspace: the tiny Llama built twice by the real pipeline (two engine limits: two repository digests),
each served by a real CPU Triton server, smoke-tested and benchmarked with `--record` (results filed under
the digest the server reports), promoted to dev and staging, a promotion to prod refused by its bench gate,
and staging rolled back (after a forced promotion). The page is opened in Debian's chromium (headless): no console message at all, the
channel table, every audit row (the refusal highlighted), a bench figure per version; a screenshot is taken
(copied to docs/release-report.png when UPDATE_DOCS_SCREENSHOTS=1, for docs/release.md).
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from trtpipe.cli import main
from trtpipe.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (scripts/install.sh --test installs it)")

# Gates every version records (its spec's release section): prod asks a TTFT no CPU server reaches.
RELEASE = """release:
  gates:
    dev:
      smoke: true
    staging:
      smoke: true
      max_regression_pct: 25
    prod:
      smoke: true
      bench:
        ttft_p99_ms: 0.001
"""


def _spec(folder: Path, model_dir: Path, max_batch_size: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"tiny-llama-cpu-b{max_batch_size}.yaml"
    path.write_text(
        "name: tiny-llama-cpu\n"
        f"model:\n  path: {model_dir.resolve()}\n  dtype: float16\n"
        "target:\n  gpu: cpu-reference\n"
        f"engine:\n  max_batch_size: {max_batch_size}\n  max_input_len: 64\n  max_seq_len: 128\n"
        "triton:\n  streaming: true\n" + RELEASE
    )
    return path


def _cli(*args: str) -> tuple[int, str]:
    import contextlib

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue() + err.getvalue()


@pytest.fixture(scope="module")
def release_home(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> dict[str, Any]:
    """Two versions built, served, smoke-tested and benchmarked for real; promotions, a refusal, a rollback."""
    from trtpipe.pipeline import run_build
    from trtpipe.serving.server import start_server

    base = tmp_path_factory.mktemp("release-report")
    home = base / "home"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TRTPIPE_USER", "release-manager")
        env.setenv("TRTPIPE_HOME", str(home))
        digests = []
        for batch in (4, 2):
            report = run_build(_spec(base / "spec", tiny_llama_dir, batch), store=home, progress=False, settings=Settings.from_env())
            assert report.status == "ok", report.error
            repo = Path(report.repository_path)
            with start_server(repo, start_timeout=120, settings=Settings.from_env()) as server:
                assert _cli("smoke", server.grpc_url, "--record", str(repo), "--store", str(home), "--max-tokens", "4")[0] == 0
                code, text = _cli(
                    "bench", server.grpc_url, "--rates", "4,16", "--requests", "8", "--input-len", "uniform:4,24",
                    "--output-len", "uniform:2,8", "--ignore-eos", "--seed", "5", "--duration", "60s", "--timeout", "30s",
                    "--metrics-url", server.metrics_url, "--record", str(repo), "--store", str(home), "--json")
                assert code == 0, text
                digests.append(server.repository_digest)
        v1, v2 = digests
        assert v1 != v2
        for digest, channel in ((v1, "dev"), (v1, "staging"), (v2, "dev")):
            code, text = _cli("promote", digest, "--to", channel, "--store", str(home))
            assert code == 0, text
        # Forced: staging's regression gate compares CPU timings of two runs (not what this test is about).
        code, text = _cli("promote", v2, "--to", "staging", "--force", "--reason", "canary checked by hand", "--store", str(home))
        assert code == 0, text
        code, text = _cli("promote", v2, "--to", "prod", "--store", str(home))
        assert code != 0 and "bench.ttft_p99_ms" in text  # refused by its gate, and recorded
        code, text = _cli("rollback", "staging", "--reason", "TTFT spike in canary", "--store", str(home))
        assert code == 0, text
    return {"home": home, "v1": v1, "v2": v2, "base": base}


class _Page(HTMLParser):
    """The elements the test looks for: rows by class, figures, images and any external reference."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[dict[str, str]] = []
        self.figures: list[dict[str, str]] = []
        self.images: list[dict[str, str]] = []
        self.tables: set[str] = set()
        self.external: list[str] = []
        self.scripts = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "tr":
            self.rows.append(a)
        elif tag == "figure":
            self.figures.append(a)
        elif tag == "img":
            self.images.append(a)
        elif tag == "table" and a.get("id"):
            self.tables.add(a["id"])
        elif tag == "script":
            self.scripts += 1
        for key in ("src", "href"):
            if a.get(key) and not a[key].startswith("data:"):
                self.external.append(a[key])


def _parse(html: str) -> _Page:
    page = _Page()
    page.feed(html)
    return page


def _rows(page: _Page, cls: str) -> list[dict[str, str]]:
    return [r for r in page.rows if cls in r.get("class", "").split()]


def _chromium(url: str, user_data: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """Headless Chromium, offline-minded flags; console messages logged to stderr (`INFO:CONSOLE`)."""
    assert CHROMIUM is not None
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={user_data}", "--enable-logging=stderr", "--v=0", "--hide-scrollbars", *extra, url],
        capture_output=True, text=True, timeout=180,
    )


def _console(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


# --------------------------------------------------------------------------- the page from a real workspace


@pytest.mark.timeout(900)
def test_report_of_two_versions_with_promotions_a_refusal_and_a_rollback(release_home: dict[str, Any], tmp_path: Path) -> None:
    home, v1, v2 = release_home["home"], release_home["v1"], release_home["v2"]
    out = tmp_path / "report"
    code, text = _cli("report", "--out", str(out), "--store", str(home), "--json")
    assert code == 0, text
    summary = json.loads(text)
    assert sorted(os.listdir(out)) == [".trtpipe-report", "index.html", "report.json"]
    assert {(c["channel"], c["digest"], c["version"]) for c in summary["channels"]} == {("dev", v2, "v2"), ("staging", v1, "v1")}
    assert all(c["signature"] == "unsigned" and c["provenance"] == "none" for c in summary["channels"])
    assert summary["audit_records"] == 6 and summary["audit_refusals"] == 1 and summary["audit_chain_problems"] == []
    assert summary["builds"] == 2
    assert [(v["label"], v["digest"], v["bench_results"], v["plotted"]) for v in summary["versions"]] == [  # one run each
        ("v1", v1, 1, True), ("v2", v2, 1, True)]
    # v2 replaced v1 in dev and in staging: one comparison each, at the staging gate's tolerance for staging.
    regressions = {r["channel"]: r for r in summary["regressions"]}
    assert set(regressions) == {"dev", "staging"} and regressions["staging"]["tolerance_pct"] == 25
    assert regressions["dev"]["tolerance_pct"] == 10  # dev's gates set none: the report's --tolerance

    html = (out / "index.html").read_text(encoding="utf-8")
    page = _parse(html)
    assert page.external == [] and page.scripts == 0  # self-contained: nothing to fetch, no script
    assert {"channel-table", "audit-table", "build-table", "regression-table"} <= page.tables
    assert [r["data-channel"] for r in _rows(page, "channel-row")] == ["dev", "staging"]
    audit_rows = _rows(page, "audit-row")
    assert [r["data-action"] for r in audit_rows] == ["promote"] * 3 + ["force-promote", "refused", "rollback"]
    assert _rows(page, "refused") == [audit_rows[4]]  # the refusal is highlighted (and the forced promotion)
    assert _rows(page, "force-promote") == [audit_rows[3]]
    assert [(f["data-version"], f["data-digest"]) for f in page.figures] == [("v1", v1), ("v2", v2)]
    plots = [i for i in page.images if "bench-plot" in i.get("class", "")]
    assert len(plots) == 2
    for image in plots:
        width, height = _png_size(base64.b64decode(image["src"].removeprefix("data:image/png;base64,")))
        assert (width, height) == (1430, 572)  # bench --plot's figure: 13 x 5.2 in at 110 dpi
    data = json.loads((out / "report.json").read_text())
    assert data["audit"]["rows"][4]["highlighted"] is True and data["audit"]["rows"][4]["failed_gates"] == ["bench.ttft_p99_ms"]


@needs_chromium
@pytest.mark.timeout(600)
def test_report_opens_in_headless_chromium_without_console_errors(release_home: dict[str, Any], tmp_path: Path) -> None:
    home, v1, v2 = release_home["home"], release_home["v1"], release_home["v2"]
    out = tmp_path / "report"
    assert _cli("report", "--out", str(out), "--store", str(home))[0] == 0
    url = (out / "index.html").as_uri()

    dumped = _chromium(url, tmp_path / "profile-dom", "--dump-dom")
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    assert _console(dumped.stderr) == []
    page = _parse(dumped.stdout)  # the DOM as the browser built it
    assert [r["data-channel"] for r in _rows(page, "channel-row")] == ["dev", "staging"]
    assert len(_rows(page, "audit-row")) == 6 and len(_rows(page, "refused")) == 1
    assert [f["data-digest"] for f in page.figures] == [v1, v2]
    assert len([i for i in page.images if "bench-plot" in i.get("class", "")]) == 2

    shot = tmp_path / "release-report.png"
    taken = _chromium(url, tmp_path / "profile-shot", f"--screenshot={shot}", "--window-size=1400,1900")
    assert taken.returncode == 0, taken.stderr[-2000:]
    assert _console(taken.stderr) == []
    assert _png_size(shot.read_bytes()) == (1400, 1900)
    import matplotlib.image

    pixels = matplotlib.image.imread(str(shot))
    assert pixels[..., :3].std() > 0.05  # not a blank page: header, tables and plots drawn
    if os.environ.get("UPDATE_DOCS_SCREENSHOTS") == "1":
        (ROOT / "docs").mkdir(exist_ok=True)
        shutil.copyfile(shot, ROOT / "docs" / "release-report.png")


@needs_chromium
@pytest.mark.timeout(120)
def test_the_console_check_sees_an_error(tmp_path: Path) -> None:
    """The harness's own control: a page that logs an error and throws is caught by the same check."""
    bad = tmp_path / "bad.html"
    bad.write_text("<!DOCTYPE html><html><body><p>x</p><script>console.error('marker-1'); missingFunction();</script></body></html>")
    run = _chromium(bad.as_uri(), tmp_path / "profile", "--dump-dom")
    found = _console(run.stderr)
    assert any("marker-1" in line for line in found) and any("missingFunction" in line for line in found)


# --------------------------------------------------------------------------- writing


def test_out_holding_other_files_is_refused_and_kept(release_home: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    code, text = _cli("report", "--out", str(out), "--store", str(release_home["home"]))
    assert code == 2 and text.count("\n") == 1 and "not a trtpipe report (notes.txt)" in text
    assert sorted(os.listdir(out)) == ["notes.txt"]


def test_an_earlier_report_is_replaced_whole(release_home: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "report"
    home = str(release_home["home"])
    assert _cli("report", "--out", str(out), "--store", home)[0] == 0
    first = (out / "index.html").read_text()
    assert _cli("report", "--out", str(out), "--store", home, "--model", "tiny-llama-cpu")[0] == 0
    assert sorted(os.listdir(out)) == [".trtpipe-report", "index.html", "report.json"]
    assert "release report: tiny-llama-cpu" in (out / "index.html").read_text() and "release report: tiny" not in first
    leftovers = [p for p in os.listdir(tmp_path) if p.startswith(".report.") and not p.endswith(".lock")]
    assert leftovers == []


def test_unknown_model_is_one_line(release_home: dict[str, Any], tmp_path: Path) -> None:
    code, text = _cli("report", "--out", str(tmp_path / "r"), "--store", str(release_home["home"]), "--model", "nope")
    assert code == 2 and text.count("\n") == 1 and "no channel, audit record, build or version of 'nope'" in text
    assert not (tmp_path / "r").exists()


def test_concurrent_reports_leave_one_whole_report(release_home: dict[str, Any], tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from trtpipe.release.report import write_report
    from trtpipe.workspace import Workspace

    out = tmp_path / "report"
    with ThreadPoolExecutor(3) as pool:
        outcomes = list(pool.map(lambda _: write_report(Workspace(release_home["home"], settings=Settings.from_env()), out), range(3)))
    assert len(outcomes) == 3
    assert sorted(os.listdir(out)) == [".trtpipe-report", "index.html", "report.json"]
    assert json.loads((out / "report.json").read_text())["home"] == str(release_home["home"])
    assert [p for p in os.listdir(tmp_path) if p != "report" and not p.endswith(".lock")] == []


# --------------------------------------------------------------------------- regressions


def test_a_worse_figure_beyond_the_channels_tolerance_is_highlighted(
        isolated_home: Path, store_entry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Flat figures recorded by hand (`results record`), 3 runs each within 1 % of each other: v2's TTFT P99 is 50 %
    worse than v1's, staging allows 10 %, dev sets no tolerance (the report's 60 % applies: no regression there); no
    record has a curve to draw. Hand-recorded results count only where the trust policy allows them: this one allows
    them in dev and staging. Every run is listed, and the interval the gate judged."""
    policy = tmp_path / "policy.yaml"
    policy.write_text("default:\n  require_signature: false\n  allow_hand_recorded: true\n")
    monkeypatch.setenv("TRTPIPE_POLICY", str(policy))
    gates = {"dev": {"smoke": True}, "staging": {"smoke": True, "max_regression_pct": 10}}
    v1 = store_entry(isolated_home, "a" * 64, seed="a", gates=gates).digest
    v2 = store_entry(isolated_home, "b" * 64, seed="b", gates=gates).digest
    for digest, ttft in ((v1, 100.0), (v2, 150.0)):
        assert _cli("results", "record", digest, "--kind", "smoke", "--passed")[0] == 0
        for noise in (1.0, 0.99, 1.01):
            figures = json.dumps({"ttft_p99_ms": ttft * noise, "output_tokens_per_s": 50.0})
            assert _cli("results", "record", digest, "--kind", "bench", "--passed", "--data", figures,
                        "--gpu-class", "cpu-reference")[0] == 0
    for digest in (v1, v2):
        assert _cli("promote", digest, "--to", "dev")[0] == 0
    assert _cli("promote", v1, "--to", "staging")[0] == 0
    code, text = _cli("promote", v2, "--to", "staging")
    assert code != 0 and "regression.ttft_p99_ms" in text  # the gate agrees with what the page will show
    assert _cli("promote", v2, "--to", "staging", "--force", "--reason", "<script>alert('longer prompts')</script>")[0] == 0

    out = tmp_path / "report"
    code, text = _cli("report", "--out", str(out), "--tolerance", "60", "--json")
    assert code == 0, text
    summary = json.loads(text)
    regressions = {r["channel"]: r for r in summary["regressions"]}
    assert regressions["staging"]["regressed"] == ["regression.ttft_p99_ms"] and regressions["staging"]["tolerance_pct"] == 10
    assert regressions["dev"]["regressed"] == [] and regressions["dev"]["tolerance_pct"] == 60
    assert [(v["label"], v["plotted"]) for v in summary["versions"]] == [("v1", False), ("v2", False)]
    page = _parse((out / "index.html").read_text())
    regressed = _rows(page, "regressed")
    assert len(regressed) == 1 and len(_rows(page, "regression-row")) == 2
    html = (out / "index.html").read_text()
    assert ("ttft_p99_ms: 3 runs vs 3 in channel, medians 150 vs 100; ratio new/old 1.5, 90% interval 1.47..1.53, "
            "limit 1.1 (10% worse): regressed beyond it") in html
    assert "new: 150.0, 148.5, 151.5 · replaced: 100.0, 99.0, 101.0" in html  # every run the gate judged
    assert len(_rows(page, "bench-run")) == 6
    assert html.count("recorded without per-run aggregates") == 2
    assert page.scripts == 0 and "&lt;script&gt;alert(&#39;longer prompts&#39;)&lt;/script&gt;" in html  # escaped

    code, text = _cli("report", "--out", str(out), "--tolerance", "-1")
    assert code == 2 and "tolerance -1% is negative" in text


def test_an_empty_workspace_renders(isolated_home: Path, tmp_path: Path) -> None:
    code, text = _cli("report", "--out", str(tmp_path / "r"), "--json")
    assert code == 0, text
    summary = json.loads(text)
    assert summary["channels"] == [] and summary["versions"] == [] and summary["builds"] == 0
    assert "No channel holds an artifact yet." in (tmp_path / "r" / "index.html").read_text()
    assert not (isolated_home / "repository").exists()  # a report creates no store


def test_a_refusal_about_no_channel_shows_in_every_models_report(isolated_home: Path, store_entry, tmp_path: Path) -> None:
    """Audit records with model "-" (a pull or serve refused before any channel) are in a --model report too,
    and make no version of a model "-"."""
    from trtpipe.release.audit import append_audit

    v1 = store_entry(isolated_home, "c" * 64, seed="c", gates={"dev": {"smoke": False}}).digest
    assert _cli("promote", v1, "--to", "dev")[0] == 0
    append_audit(isolated_home, at="2026-01-01T00:00:00.000+00:00", who="ci", action="refused", channel="-", model="-",
                 target="-", from_digest=None, to_digest="sha256:" + "d" * 64, reason="pull refused: unsigned")
    code, text = _cli("report", "--out", str(tmp_path / "r"), "--model", "tiny-llama", "--json")
    assert code == 0, text
    summary = json.loads(text)
    assert summary["audit_records"] == 2 and summary["audit_refusals"] == 1
    assert [(v["label"], v["digest"]) for v in summary["versions"]] == [("v1", v1)]
    assert "pull refused: unsigned" in (tmp_path / "r" / "index.html").read_text()


# --------------------------------------------------------------------------- signature and provenance


def test_a_signed_pulled_artifact_shows_signed_with_provenance_and_an_untrusted_signer_shows_untrusted(
        registry_env, isolated_home: Path, store_entry, tmp_path: Path, cli, monkeypatch) -> None:
    """Signed and pushed with a release key (real registry), pulled into another workspace and promoted there:
    the page reads the kept bundle and provenance. Under a policy listing the release key: signed by it,
    provenance verified; under one listing another key: untrusted; under none: unverified. A local
    build promoted beside it stays unsigned with no provenance; a file changed after the pull is invalid."""
    from trtpipe import signing_keys as K

    keys = {}
    for name in ("release", "stranger"):
        keys[name] = K.generate_key()
        K.write_key_pair(keys[name], tmp_path / f"{name}.key", tmp_path / f"{name}.pub")
        (tmp_path / f"{name}-policy.yaml").write_text(f"keys:\n  {name}: {tmp_path / f'{name}.pub'}\n")
    gates = {"dev": {"smoke": False}}
    signed = store_entry(isolated_home, "e" * 64, seed="signed", gates=gates)
    url = registry_env.url("report/signed")
    code, out, err = cli("cache", "push", signed.digest, "--to", url, "--tag", "v1", "--sign", str(tmp_path / "release.key"), "--json")
    assert code == 0, err

    workspace = tmp_path / "workspace"
    monkeypatch.setenv("TRTPIPE_HOME", str(workspace))
    code, out, err = cli("cache", "pull", url + ":v1", "--json")
    assert code == 0, err
    assert json.loads(out)["artifact_digest"] == signed.digest
    local = store_entry(workspace, "f" * 64, seed="local", model="other-llama", gates=gates)
    for digest in (signed.digest, local.digest):
        code, _, err = cli("promote", digest, "--to", "dev")
        assert code == 0, err

    def report(policy: str | None) -> tuple[dict[str, dict[str, Any]], str]:
        if policy is None:
            monkeypatch.delenv("TRTPIPE_POLICY", raising=False)
        else:
            monkeypatch.setenv("TRTPIPE_POLICY", str(tmp_path / f"{policy}-policy.yaml"))
        target = tmp_path / f"report-{policy}"
        code, out, err = cli("report", "--out", str(target), "--json")
        assert code == 0, err
        rows = {c["digest"]: c for c in json.loads(out)["channels"]}
        assert set(rows) == {signed.digest, local.digest}
        return rows, (target / "index.html").read_text(encoding="utf-8")

    def trust_cells(html: str, model: str) -> str:
        """The channel row of `model`, as text."""
        start = html.index(f"<td>{model} / cpu-reference</td>")
        return html[start:html.index("</tr>", start)]

    rows, html = report("release")
    assert (rows[signed.digest]["signature"], rows[signed.digest]["signer"], rows[signed.digest]["provenance"]) == (
        "signed", f"release (key id {keys['release'].key_id[:16]})", "present")
    row = trust_cells(html, "tiny-llama")
    assert '<span class="badge signed">signed</span> release' in row
    assert '<span class="badge present">present</span>' in row and "signed by trusted key release" in row
    assert (rows[local.digest]["signature"], rows[local.digest]["signer"], rows[local.digest]["provenance"]) == (
        "unsigned", None, "none")
    row = trust_cells(html, "other-llama")
    assert '<span class="badge unsigned">unsigned</span>' in row and "no provenance" in row

    rows, html = report("stranger")
    assert (rows[signed.digest]["signature"], rows[signed.digest]["provenance"]) == ("untrusted", "present")
    assert rows[signed.digest]["signer"] is None  # no key of this policy verified it: no signer to name
    row = trust_cells(html, "tiny-llama")
    assert '<span class="badge untrusted">untrusted</span>' in row and "verifies under them" in row
    assert keys["release"].key_id[:16] not in row
    assert "NOT verified" in row
    assert rows[local.digest]["signature"] == "unsigned"

    rows, html = report(None)
    assert (rows[signed.digest]["signature"], rows[signed.digest]["signer"], rows[signed.digest]["provenance"]) == (
        "unverified", None, "present")
    assert "not verified: no trust policy" in trust_cells(html, "tiny-llama")
    assert keys["release"].key_id[:16] not in trust_cells(html, "tiny-llama")

    # With TRTPIPE_POLICY unset, the workspace's own policy (`policy set`) is what the page judges under.
    code, _, err = cli("policy", "set", str(tmp_path / "release-policy.yaml"))
    assert code == 0, err
    rows, _ = report(None)
    assert (rows[signed.digest]["signature"], rows[signed.digest]["signer"]) == (
        "signed", f"release (key id {keys['release'].key_id[:16]})")

    # A file of the pulled entry changed in place (same size): the release key's signature no longer matches.
    from trtpipe.store.local import Store

    weights = Store.open(workspace).find(signed.digest).path / "rank0.safetensors"
    body = bytearray(weights.read_bytes())
    body[0] ^= 1
    weights.chmod(0o644)
    weights.write_bytes(bytes(body))
    rows, html = report("release")
    assert rows[signed.digest]["signature"] == "invalid"
    assert "rank0.safetensors changed" in trust_cells(html, "tiny-llama")


def test_an_artifact_not_in_the_store_is_unknown(tmp_path: Path) -> None:
    """Its signature cannot be checked over files this workspace does not hold: unknown, not unsigned."""
    from trtpipe.release.report_trust import artifact_trust
    from trtpipe.workspace import Workspace

    trust = artifact_trust(Workspace(tmp_path, settings=Settings()), "sha256:" + "0" * 64, None, "dev")
    assert (trust.signature, trust.signer, trust.provenance) == ("unknown", None, "unknown")
    assert "not in this store" in trust.signature_detail
