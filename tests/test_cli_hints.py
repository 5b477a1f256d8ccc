"""Errors and hints: library errors name no command or flag; every command and flag the CLI names exists.

A hint that names a command the CLI no longer has (`trtpipe build --timeout` once) is caught here:
every hint in `trtpipe.commands.hints.HINTS`, and every `trtpipe ...` quoted in the CLI's own
modules, is parsed and looked up in the typer app itself.
"""

from __future__ import annotations

import ast
import re
import string
from pathlib import Path

import pytest
import typer

from trtpipe.cli import make_app
from trtpipe.commands.hints import HINTS, hint_for
from trtpipe.errors import (
    Conflict,
    DiskFull,
    GateRefused,
    IntegrityError,
    MissingCapability,
    NotFound,
    TimedOut,
    TrtpipeError,
    Untrusted,
)

PACKAGE = Path(__file__).resolve().parents[1] / "trtpipe"
CLI_MODULES = sorted([PACKAGE / "cli.py", *(PACKAGE / "commands").glob("*.py")])
QUOTED_COMMAND = re.compile(r"`(trtpipe [^`]+)`")


def _command_tree() -> dict[str, object]:
    return typer.main.get_command(make_app()).commands  # type: ignore[attr-defined]


def _options(command: object) -> set[str]:
    names: set[str] = set()
    for param in getattr(command, "params", []):
        names.update(getattr(param, "opts", []))
        names.update(getattr(param, "secondary_opts", []))
    return names | {"--help"}


def check_invocation(text: str) -> list[str]:
    """Problems with one quoted `trtpipe ...` invocation: an unknown command, or a flag it does not take."""
    words = text.split()
    assert words[0] == "trtpipe"
    if "..." in words:  # prose: `trtpipe cache ...` stands for the whole group
        return []
    commands = _command_tree()
    command: object | None = None
    path = ["trtpipe"]
    rest = words[1:]
    while rest and not rest[0].startswith("-"):
        group = commands if command is None else getattr(command, "commands", None)
        if not isinstance(group, dict) or rest[0] not in group:
            break
        command = group[rest[0]]
        path.append(rest.pop(0))
    if command is None and rest and rest[0].startswith("--"):
        command = typer.main.get_command(make_app())  # the root: --version, --help
    elif command is None or getattr(command, "commands", None):
        return [f"`{text}`: no such command ({' '.join(path)} {rest[0] if rest else ''})"]
    known = _options(command)
    return [f"`{text}`: {' '.join(path)} has no option {flag}"
            for flag in (w.split("=")[0] for w in rest if w.startswith("--")) if flag not in known]


def _render(text: str, example: dict[str, str]) -> str:
    values = {name: example.get(name, name.upper()) for _, name, _, _ in string.Formatter().parse(text) if name}
    return text.format(**values)


def test_every_hint_names_real_commands_and_flags() -> None:
    quoted = 0
    problems: list[str] = []
    for hint in HINTS:
        for invocation in QUOTED_COMMAND.findall(_render(hint.text, hint.example)):
            quoted += 1
            problems += check_invocation(invocation)
    assert quoted >= 8  # the table does name commands
    assert problems == []


def test_every_command_quoted_in_the_cli_exists() -> None:
    problems: list[str] = []
    seen = 0
    for path in CLI_MODULES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                for invocation in QUOTED_COMMAND.findall(node.value):
                    seen += 1
                    problems += [f"{path.name}: {p}" for p in check_invocation(invocation.split("{")[0].strip())]
    assert seen >= 2 and problems == []


def test_the_checker_catches_a_made_up_command_and_flag() -> None:
    assert check_invocation("trtpipe build --timeout 60")  # the drift doctor once advised
    assert check_invocation("trtpipe cache frobnicate")
    assert check_invocation("trtpipe build SPEC --force engine") == []
    assert check_invocation("trtpipe cache verify --repair --store oci://HOST/REPO") == []


def _fix_strings(path: Path) -> list[tuple[int, str]]:
    """Every string (and f-string's literal text) passed as `fix=` in a module."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        for keyword in node.keywords:
            if keyword.arg != "fix":
                continue
            parts = [n.value for n in ast.walk(keyword.value) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
            found.append((keyword.value.lineno, "".join(parts)))
    return found


def _all_flags() -> set[str]:
    flags: set[str] = set()
    stack = list(_command_tree().values())
    while stack:
        command = stack.pop()
        flags |= _options(command)
        stack += list((getattr(command, "commands", None) or {}).values())
    return flags - {"--help"}


def test_library_fix_texts_name_no_command_or_flag() -> None:
    """Library `fix=` texts say what to change, in the library's words: no `trtpipe <command>` and none of the
    CLI's flags (another tool's, like pip's --no-deps, may appear)."""
    command = re.compile(r"\btrtpipe (?:" + "|".join(map(re.escape, _command_tree())) + r")\b")
    flags = _all_flags()
    flag = re.compile(r"(?<![\w-])--[a-z][a-z-]+")
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel == "cli.py" or rel.startswith("commands/"):
            continue
        for line, text in _fix_strings(path):
            if command.search(text) or any(f in flags for f in flag.findall(text)):
                problems.append(f"{rel}:{line}: {text}")
    assert problems == []


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (NotFound("x", what="artifact", ref="abcd"), "trtpipe cache ls"),
        (NotFound("x", what="channel", ref="prod"), "trtpipe channels"),
        (GateRefused("x", channel="prod", digest="sha256:" + "b" * 64, failed=["smoke"]),
         "--to prod --force --reason"),
        (Conflict("x", resource="channel m/t/prod"), "trtpipe history --channel"),
        (IntegrityError("x", path="/s/repository/k", in_store=True), "trtpipe cache verify --repair"),
        (IntegrityError("x", path="/home/policy/policy.yaml"), "trtpipe policy set FILE"),
        (MissingCapability("x"), "trtpipe check --spec"),
        (MissingCapability("keyless sigstore signing failed (x)"), "--sign KEY"),
        (Untrusted("x", subject="repository/k", missing=["a signature by release"]), "trtpipe cache push REF"),
        (TimedOut("x", operation="engine build", seconds=60), "executor timeout in the spec"),
        (DiskFull("x", path="/store/tmp/x", free=0), "trtpipe cache gc --max-size"),
    ],
)
def test_hint_for_each_kind_of_error(error: TrtpipeError, expected: str) -> None:
    hint = hint_for(error)
    assert hint is not None and expected in hint


def test_no_hint_where_none_fits() -> None:
    assert hint_for(TrtpipeError("plain")) is None
    assert hint_for(IntegrityError("a registry blob was tampered with", path="host/repo@sha256:x")) is None
    assert hint_for(Conflict("tag moved", resource="host/repo:v1")) is None


def test_the_fix_scanner_sees_fstrings_and_plain_strings(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text('raise E("x", fix=f"run `trtpipe cache verify --repair` on {where}")\n'
                      'raise E("y", fix="edit the spec")\n')
    assert [line for line, _ in _fix_strings(module)] == [1, 2]
    assert "trtpipe cache verify --repair" in _fix_strings(module)[0][1]


def test_doctor_advises_the_spec_field_not_a_flag_that_never_existed(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from trtpipe.cli import main

    log = tmp_path / "build.log"
    log.write_text("[trtpipe] killed after timeout (3600 s)\n")
    assert main(["doctor", str(log), "--json"]) == 0
    import json

    (diagnosis,) = json.loads(capsys.readouterr().out)["diagnoses"]
    assert "backend.build_timeout" in diagnosis["fix"] and "--timeout" not in diagnosis["fix"]
    assert not any(check_invocation(i) for i in QUOTED_COMMAND.findall(diagnosis["fix"]))
