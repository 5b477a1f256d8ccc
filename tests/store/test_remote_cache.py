"""`trtpipe build --store oci://...`: a second machine (a fresh store) pulls every stage instead of building it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(600)


def test_shared_cache_through_a_registry(registry, tiny_spec: Path, tmp_path: Path, tools, monkeypatch) -> None:
    host, user, password = registry.host, registry.username, registry.password
    monkeypatch.setenv("HOME", str(tmp_path))  # no user Docker config may leak credentials in
    monkeypatch.delenv("DOCKER_CONFIG", raising=False)
    monkeypatch.setenv("TRTPIPE_REGISTRY_USERNAME", user)
    monkeypatch.setenv("TRTPIPE_REGISTRY_PASSWORD", password)
    remote = f"oci://{host}/trtpipe/cache"

    first_home = tmp_path / "machine-a"
    first = tools.run_cli(first_home, "build", str(tiny_spec), "--store", remote, "--json")
    assert first.returncode == 0, first.stderr
    built = json.loads(first.stdout)
    assert [s["outcome"] for s in built["stages"][2:]] == ["built"] * 3
    assert all(s["detail"].startswith("pushed to ") for s in built["stages"][2:]), built["stages"]

    second_home = tmp_path / "machine-b"
    dry = json.loads(tools.run_cli(second_home, "build", str(tiny_spec), "--store", remote, "--dry-run",
                                   "--json").stdout)
    assert [s["outcome"] for s in dry["stages"][2:]] == ["would-pull"] * 3
    second = tools.run_cli(second_home, "build", str(tiny_spec), "--store", remote, "--json")
    assert second.returncode == 0, second.stderr
    pulled = json.loads(second.stdout)
    assert [s["outcome"] for s in pulled["stages"][2:]] == ["pulled"] * 3
    assert pulled["artifacts"] == built["artifacts"]  # the same artifacts, by digest
    assert tools.built_lines(second_home) == []  # machine B built nothing
    assert tools.run_cli(second_home, "cache", "verify").returncode == 0
    again = json.loads(tools.run_cli(second_home, "build", str(tiny_spec), "--store", remote, "--json").stdout)
    assert [s["outcome"] for s in again["stages"][2:]] == ["hit"] * 3
