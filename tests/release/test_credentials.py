"""Credentials never enter a reference, a message, a record or a file: `user:password@` is refused in
one line that does not repeat it, and nothing under the workspace holds it afterwards."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtpipe.settings import child_environment, has_credentials, redact_credentials

pytestmark = pytest.mark.timeout(120)

SECRET = "hunter2-s3cret"
REFS = [f"oci://alice:{SECRET}@127.0.0.1:5000/engines:prod",
        f"oci://alice:{SECRET}@127.0.0.1:5000/engines@sha256:" + "ab" * 32,
        f"oci://{SECRET}@127.0.0.1:5000/engines",  # a token as the user name
        f"oci://alice:{SECRET}@127.0.0.1"]  # no repository either: still not echoed


def _files_holding(root: Path, text: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and text.encode() in p.read_bytes()]


@pytest.mark.parametrize("ref", REFS)
def test_credentials_in_a_reference_are_refused_without_echo(isolated_home, store_entry, cli, ref) -> None:
    entry = store_entry(isolated_home, "c1" * 8)
    for args in (("cache", "pull", ref), ("promote", ref, "--to", "prod"),
                 ("cache", "push", entry.key, "--to", ref), ("cache", "ls", "--store", ref)):
        code, out, err = cli(*args)
        assert code == 2, (args, err)
        assert SECRET not in out + err and "alice" not in out + err
        assert len(err.strip().splitlines()) == 1 and "must not carry credentials" in err
        assert "TRTPIPE_REGISTRY_PASSWORD" in err
    assert _files_holding(isolated_home, SECRET) == []


def test_credentials_in_the_store_setting_are_refused(isolated_home, cli, monkeypatch) -> None:
    monkeypatch.setenv("TRTPIPE_STORE", REFS[0].rsplit(":", 1)[0])
    code, out, err = cli("cache", "ls")
    assert code == 2 and SECRET not in out + err and "must not carry credentials" in err


def test_helpers() -> None:
    assert has_credentials(REFS[0]) and not has_credentials("oci://127.0.0.1:5000/engines@sha256:" + "ab" * 32)
    assert redact_credentials(REFS[0]) == "oci://***@127.0.0.1:5000/engines:prod"
    env = child_environment({"TRTPIPE_REGISTRY_PASSWORD": SECRET, "TRTPIPE_SIGNING_KEY": "k", "PATH": "/bin"})
    assert env == {"PATH": "/bin"}
