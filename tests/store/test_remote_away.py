"""A remote build cache that is away (stopped, or refusing the credentials) is a warning and a local build, as
Bazel's remote cache and sccache behave; required (--require-remote, TRTPIPE_REQUIRE_REMOTE=1) it is one error
line and a non-zero exit. Read-only (a pull request) pulls what the cache holds and never pushes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(900)


@pytest.fixture
def clean_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No user Docker config and no inherited cache settings may leak into the builds."""
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("DOCKER_CONFIG", "TRTPIPE_STORE", "TRTPIPE_REMOTE_MODE", "TRTPIPE_REQUIRE_REMOTE",
                 "TRTPIPE_REGISTRY_USERNAME", "TRTPIPE_REGISTRY_PASSWORD"):
        monkeypatch.delenv(name, raising=False)


def _stored_outcomes(report: dict) -> list[str]:
    return [s["outcome"] for s in report["stages"][2:]]  # after resolve and plan


def test_a_stopped_registry_is_a_warning_and_a_local_build(serve_registry, tiny_spec: Path, tmp_path: Path, tools,
                                                           clean_env, monkeypatch: pytest.MonkeyPatch) -> None:
    import bcrypt

    base = tmp_path / "registry"
    base.mkdir()
    (base / "htpasswd").write_text("u:" + bcrypt.hashpw(b"p", bcrypt.gensalt(rounds=4)).decode() + "\n")
    with serve_registry(base, ["  htpasswd:", "    realm: t", f"    path: {base / 'htpasswd'}"], "u", "p") as reg:
        remote = reg.url("trtpipe/cache")
    # The context has ended: the registry is stopped and nothing listens on its port any more.
    monkeypatch.setenv("TRTPIPE_REGISTRY_USERNAME", "u")
    monkeypatch.setenv("TRTPIPE_REGISTRY_PASSWORD", "p")

    required = tools.run_cli(tmp_path / "required", "build", str(tiny_spec), "--store", remote, "--require-remote",
                             "--json")
    assert required.returncode == 1, required.stderr
    lines = required.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), required.stderr
    assert f"requires its remote cache {remote}" in lines[0] and "unreachable" in lines[0], lines[0]
    assert tools.built_lines(tmp_path / "required") == []  # refused before any stage was built

    env = tools.cli_env(tmp_path / "by-setting")
    env["TRTPIPE_REQUIRE_REMOTE"] = "1"
    import subprocess

    by_setting = subprocess.run(tools.trtpipe_cmd("build", str(tiny_spec), "--store", remote, "--json"), env=env,
                                capture_output=True, text=True, timeout=600)
    assert by_setting.returncode == 1 and "requires its remote cache" in by_setting.stderr, by_setting.stderr

    home = tmp_path / "best-effort"
    dry = tools.run_cli(home, "build", str(tiny_spec), "--store", remote, "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    assert _stored_outcomes(json.loads(dry.stdout)) == ["would-build"] * 3 and "warning: remote cache" in dry.stderr

    built = tools.run_cli(home, "build", str(tiny_spec), "--store", remote, "--json")
    assert built.returncode == 0, built.stderr
    report = json.loads(built.stdout)
    assert _stored_outcomes(report) == ["built"] * 3
    assert report["remote"] == remote and "unreachable" in report["remote_unavailable"]
    warning = [line for line in built.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warning) == 1 and "building with the local store only" in warning[0], built.stderr
    assert all("push" not in (s["detail"] or "") for s in report["stages"][2:]), report["stages"]
    assert len(tools.built_lines(home)) == 3 and tools.visible_entries_complete(home) == []


def test_refused_credentials_are_a_warning_and_a_local_build(registry, tiny_spec: Path, tmp_path: Path, tools,
                                                             clean_env, monkeypatch: pytest.MonkeyPatch) -> None:
    remote = registry.url("trtpipe/away-credentials")
    monkeypatch.setenv("TRTPIPE_REGISTRY_USERNAME", registry.username)
    monkeypatch.setenv("TRTPIPE_REGISTRY_PASSWORD", "not-" + registry.password)

    required = tools.run_cli(tmp_path / "required", "build", str(tiny_spec), "--store", remote, "--require-remote",
                             "--json")
    assert required.returncode == 2, required.stderr  # AccessDenied: fix the credentials
    lines = required.stderr.strip().splitlines()
    assert len(lines) == 1 and "rejected the credentials" in lines[0] and "requires its remote cache" in lines[0]
    assert registry.password not in required.stderr

    home = tmp_path / "best-effort"
    built = tools.run_cli(home, "build", str(tiny_spec), "--store", remote, "--json")
    assert built.returncode == 0, built.stderr
    report = json.loads(built.stdout)
    assert _stored_outcomes(report) == ["built"] * 3 and "rejected the credentials" in report["remote_unavailable"]
    assert "warning: remote cache" in built.stderr and registry.password not in built.stderr + built.stdout

    # No credentials at all (a fork's pull request has no secrets): the same, a warning and a local build.
    monkeypatch.delenv("TRTPIPE_REGISTRY_USERNAME")
    monkeypatch.delenv("TRTPIPE_REGISTRY_PASSWORD")
    again = tools.run_cli(home, "build", str(tiny_spec), "--store", remote, "--json")
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    assert _stored_outcomes(report) == ["hit"] * 3 and "requires credentials" in report["remote_unavailable"]


def test_read_only_pulls_hits_and_never_pushes(registry, tiny_spec: Path, tmp_path: Path, tools, clean_env,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from trtpipe.settings import Settings
    from trtpipe.stages import weight_file_rule
    from trtpipe.store.oci import OciRemote

    monkeypatch.setenv("TRTPIPE_REGISTRY_USERNAME", registry.username)
    monkeypatch.setenv("TRTPIPE_REGISTRY_PASSWORD", registry.password)
    remote = registry.url("trtpipe/read-only")
    main_branch = json.loads(tools.run_cli(tmp_path / "main", "build", str(tiny_spec), "--store", remote,
                                           "--json").stdout)
    assert _stored_outcomes(main_branch) == ["built"] * 3 and main_branch["remote_mode"] == "read-write"

    # A pull request changes the engine limits: the checkpoint is a hit in the cache, engine and repository are new.
    changed = tmp_path / "pr.yaml"
    changed.write_text(tiny_spec.read_text().replace("max_batch_size: 4", "max_batch_size: 8"))
    pr = tools.run_cli(tmp_path / "pr", "build", str(changed), "--store", remote, "--remote-mode", "read-only",
                       "--json")
    assert pr.returncode == 0, pr.stderr
    report = json.loads(pr.stdout)
    assert _stored_outcomes(report) == ["pulled", "built", "built"] and report["remote_mode"] == "read-only"
    assert all(s["detail"].startswith("not pushed: the remote cache") for s in report["stages"][3:]), report["stages"]
    assert report["remote_unavailable"] is None

    # The setting does the same as the option.
    env = tools.cli_env(tmp_path / "pr-2")
    env["TRTPIPE_REMOTE_MODE"] = "read-only"
    import subprocess

    by_setting = subprocess.run(tools.trtpipe_cmd("build", str(changed), "--store", remote, "--json"), env=env,
                                capture_output=True, text=True, timeout=600)
    assert by_setting.returncode == 0, by_setting.stderr
    again = json.loads(by_setting.stdout)
    assert again["remote_mode"] == "read-only" and _stored_outcomes(again) == ["pulled", "built", "built"]

    cache = OciRemote(remote, settings=Settings.from_env(), weights=weight_file_rule())
    for stage in report["stages"][3:]:
        kind = {"engine": "engine", "publish": "repository"}[stage["name"]]
        assert cache.find(kind, stage["key"]) is None, f"a read-only build pushed {kind}"
    assert cache.find("checkpoint", report["stages"][2]["key"]) is not None
    bad = subprocess.run(tools.trtpipe_cmd("build", str(changed), "--store", remote, "--json"),
                         env={**env, "TRTPIPE_REMOTE_MODE": "write-only"}, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "TRTPIPE_REMOTE_MODE='write-only' is not a remote cache mode" in bad.stderr
