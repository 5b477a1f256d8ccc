"""The CLI shell: a user's mistake or a refusing filesystem is one line and a non-zero exit, never a traceback."""

from __future__ import annotations

import pytest

from trtpipe.cli import main


def test_filesystem_refusal_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["example-model", "/proc/trtpipe-cannot-write-here"])  # procfs refuses new files
    err = capsys.readouterr().err.strip()
    assert code == 1
    assert len(err.splitlines()) == 1 and err.startswith("error: /proc/") and "Traceback" not in err


def test_usage_error_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan"]) == 2
    assert "Missing argument" in capsys.readouterr().err


def test_unknown_command_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["no-such-command"]) == 2
    assert "No such command" in capsys.readouterr().err
