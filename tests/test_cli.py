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


# --------------------------------------------------------------------------- the app's shape

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import typer

from trtpipe.cli import make_app

ROOT = Path(__file__).resolve().parents[1]
PANELS = ("Plan", "Build", "Serve", "Release", "Store")


def _walk(command: object, path: tuple[str, ...] = ()):
    yield path, command
    for name, sub in (getattr(command, "commands", None) or {}).items():
        yield from _walk(sub, (*path, name))


def _toolchain_lines(configs: Path) -> list[tuple[str, str]]:
    """(name, TensorRT-LLM version) of each line of a toolchains.yaml, read with PyYAML, not trtpipe."""
    import yaml

    return [(t["name"], t["trtllm_version"]) for t in yaml.safe_load((configs / "toolchains.yaml").read_text())["toolchains"]]


def test_version_names_the_version_and_the_pinned_toolchains(capsys: pytest.CaptureFixture[str]) -> None:
    from trtpipe import __version__

    assert main(["--version"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"trtpipe {__version__}"  # the first line stays what scripts read
    pinned = _toolchain_lines(ROOT / "build_configs")
    assert [tuple(line.split()[:2]) for line in lines[2:2 + len(pinned)]] == pinned
    assert main(["--version", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["ok"] and info["trtpipe"] == __version__ and info["problem"] is None
    assert [(t["name"], t["trtllm_version"]) for t in info["toolchains"]] == pinned
    assert info["data"]["build_configs"] == str(ROOT / "build_configs") and info["data"]["build_configs_from"] == "checkout"


def test_version_reads_the_table_in_use(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """$TRTPIPE_BUILD_CONFIGS with one toolchain line removed: --version names the folder and lists one fewer."""
    import shutil

    import yaml

    configs = shutil.copytree(ROOT / "build_configs", tmp_path / "build_configs")
    table = yaml.safe_load((configs / "toolchains.yaml").read_text())
    dropped = table["toolchains"].pop(0)["name"]
    (configs / "toolchains.yaml").write_text(yaml.safe_dump(table, sort_keys=False))
    monkeypatch.setenv("TRTPIPE_BUILD_CONFIGS", str(configs))
    assert main(["--version", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert [(t["name"], t["trtllm_version"]) for t in info["toolchains"]] == _toolchain_lines(configs)
    assert dropped not in {t["name"] for t in info["toolchains"]}
    assert info["data"]["build_configs"] == str(configs) and info["data"]["build_configs_from"] == "TRTPIPE_BUILD_CONFIGS"


def test_version_of_a_broken_install_still_says_the_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    from trtpipe import __version__

    monkeypatch.setenv("TRTPIPE_BUILD_CONFIGS", str(tmp_path / "nowhere"))
    assert main(["--version"]) == 3
    captured = capsys.readouterr()
    assert captured.out.splitlines()[0] == f"trtpipe {__version__}"
    assert len(captured.err.splitlines()) == 1 and "toolchains.yaml is missing" in captured.err
    assert main(["--version", "--json"]) == 3
    captured = capsys.readouterr()
    info = json.loads(captured.out)
    assert info["ok"] is False and info["trtpipe"] == __version__ and info["toolchains"] is None
    assert info["problem"]["exit_code"] == 3 and str(tmp_path / "nowhere") in info["problem"]["error"]
    assert "Traceback" not in captured.err


def test_json_before_a_command_is_refused_not_dropped(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--json", "check"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "put --json after the command" in err


def test_every_option_and_argument_is_described() -> None:
    root = typer.main.get_command(make_app())
    missing = []
    for path, command in _walk(root):
        for param in getattr(command, "params", []):
            if not (getattr(param, "help", None) or "").strip():
                missing.append(f"trtpipe {' '.join(path)} {param.opts[0] if param.opts else param.name}")
    assert missing == []


def test_every_command_sits_in_a_help_panel() -> None:
    root = typer.main.get_command(make_app())
    panels = {name: getattr(command, "rich_help_panel", None) for name, command in root.commands.items()}
    assert set(panels.values()) == set(PANELS), panels
    assert panels["build"] == "Build" and panels["cache"] == "Store" and panels["promote"] == "Release"


def _readme_table(heading: str) -> dict[str, str]:
    """A table of the command-line page the README links (docs/cli.md)."""
    text = (ROOT / "docs" / "cli.md").read_text()
    start = text.index(heading)
    rows = {}
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            if rows:
                break
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0] in ("exit", "variable") or set(cells[0]) <= {"-"}:
            continue
        rows[cells[0].strip("`")] = cells[1]
    return rows


def test_readme_exit_code_table_is_errors_table() -> None:
    from trtpipe.errors import EXIT_CODES

    table = _readme_table("Exit codes, for every command")
    assert {int(k): v for k, v in table.items()} == EXIT_CODES


def test_readme_lists_every_environment_variable() -> None:
    from trtpipe.settings import VARIABLES

    assert set(_readme_table("Environment variables (read in")) == set(VARIABLES)


def test_only_the_settings_module_reads_trtpipe_environment_variables() -> None:
    """`os.environ[...]`, `os.environ.get(...)` or `os.getenv(...)` of a variable trtpipe defines: settings.py only."""
    import ast

    from trtpipe.settings import VARIABLES

    readers = []
    for path in sorted((ROOT / "trtpipe").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            key = None
            if isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ":
                key = node.slice
            elif isinstance(node, ast.Call) and ast.unparse(node.func) in ("os.environ.get", "os.getenv") and node.args:
                key = node.args[0]
            if isinstance(key, ast.Constant) and key.value in VARIABLES:
                readers.append(f"{path.relative_to(ROOT)}:{node.lineno}: {key.value}")
    assert readers == []
    settings_text = (ROOT / "trtpipe" / "settings.py").read_text()
    assert all(f'"{name}"' in settings_text for name in VARIABLES)


# --------------------------------------------------------------------------- where things live


def test_one_rule_for_the_workspace_root(tmp_path: Path) -> None:
    from trtpipe.settings import Settings, places

    home, other = tmp_path / "home", tmp_path / "other"
    assert places(None, Settings(home=home)) == (home, None)
    assert places(str(other), Settings(home=home)) == (other, None)
    assert places(None, Settings(home=home, store=str(other))) == (other, None)
    assert places(None, Settings(home=home, store="oci://127.0.0.1:5000/cache")) == (home, "oci://127.0.0.1:5000/cache")
    assert places("oci://h:1/r", Settings(home=home, store=str(other))) == (home, "oci://h:1/r")  # --store wins
    env = Settings.from_env({"TRTPIPE_HOME": str(home), "TRTPIPE_REGISTRY_INSECURE": "a:1, b:2",
                             "TRTPIPE_REGISTRY_PASSWORD": "", "GITHUB_ACTOR": "ci-bot"})
    assert env.home == home and env.registry_insecure == ("a:1", "b:2") and env.actor == "ci-bot"
    assert env.registry_password == ""
    assert "secret" not in repr(Settings.from_env({"TRTPIPE_REGISTRY_PASSWORD": "secret"}))


def test_a_remote_of_an_unknown_scheme_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: x\n")
    code = main(["build", str(spec), "--store", "s3://bucket/cache"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "'s3://bucket/cache' is not a remote trtpipe knows" in err
    assert "oci://" in err


# --------------------------------------------------------------------------- CI logs: tables, Ctrl-C


def _long_store(root: Path) -> dict[str, str]:
    """A workspace with an artifact of a long key and name, a channel pointing at it and a build record."""
    from trtpipe.build_record import BuildRecord, write_record
    from trtpipe.release.audit import append_audit
    from trtpipe.store.local import Store

    key = "k" * 64
    name = "a-model-name-far-too-long-for-an-eighty-column-table"
    store = Store.open(root)
    with store.building("repository", key) as b:
        (b.dir / "trtpipe.json").write_text("{}")
        entry = b.commit(inputs={"name": name, "target": {"gpu": "cpu-reference"}})
    append_audit(root, channel="production-eu-west", model=name, target="cpu-reference", action="promote",
                 from_digest=None, to_digest=entry.digest, at="2026-01-01T00:00:00", who="release-bot")
    write_record(root, BuildRecord(id="r1", started_at="2026-01-01T00:00:00", finished_at="2026-01-01T00:00:01",
                                   status="ok", host="h", platform="p", python="3", spec_path="s.yaml", model=name,
                                   target="cpu-reference", artifacts={"repository": entry.digest}))
    return {"key": key, "digest": entry.digest, "name": name}


def _run(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TRTPIPE_HOME": str(home), "COLUMNS": "80", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "trtpipe.cli", *args], env=env, capture_output=True, text=True,
                          timeout=120)


def test_tables_keep_whole_keys_and_names_in_a_pipe_at_80_columns(tmp_path: Path) -> None:
    home = tmp_path / "home"
    facts = _long_store(home)
    for args, wanted in ((["cache", "ls"], [facts["key"], facts["digest"], facts["name"]]),
                         (["history"], [facts["name"], facts["digest"]]),
                         (["channels"], ["production-eu-west", facts["name"], facts["digest"]])):
        done = _run(*args, home=home)
        assert done.returncode == 0, done.stderr
        assert all(text in done.stdout for text in wanted), (args, done.stdout)
        assert "…" not in done.stdout and "\x1b[" not in done.stdout  # no ellipsis, no colour codes in a log
        assert max(len(line) for line in done.stdout.splitlines()) > 80  # wider than the terminal said: not cut


def _interrupted_build(tmp_path: Path, tiny_llama_dir: Path, capsys: pytest.CaptureFixture[str]) -> tuple[str, object]:
    """Build the tiny model (cpu-reference) through the CLI, in this process, until a patch raises Ctrl-C."""
    from trtpipe.store.local import Store

    spec = tmp_path / "spec.yaml"
    spec.write_text(f"model:\n  path: {tiny_llama_dir}\ntarget:\n  gpu: cpu-reference\n"
                    "engine:\n  max_batch_size: 4\n  max_input_len: 64\n  max_seq_len: 128\n")
    code = main(["build", str(spec), "--store", str(tmp_path / "store")])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 130 and err.startswith("interrupted: nothing half-written"), err
    return err, Store.open(tmp_path / "store")


def test_ctrl_c_in_build_says_what_was_stored(tmp_path: Path, tiny_llama_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C while the engine is half written: the checkpoint stored before it is named, the engine is not, and
    nothing of the engine is left behind."""
    from trtpipe.stages.engine import EngineStage

    def half_written(self, ctx, out_dir, inputs, key):  # noqa: ANN001, ANN202
        (out_dir / "rank0.engine").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(EngineStage, "build", half_written)
    err, store = _interrupted_build(tmp_path, tiny_llama_dir, capsys)
    [checkpoint] = list(store.entries("checkpoint"))
    assert f"checkpoint {checkpoint.digest}" in err and "the next build reuses" in err
    assert "engine" not in err.split("stages stored:")[1] and list(store.entries("engine")) == []
    assert list((tmp_path / "store" / "tmp").iterdir()) == []


def test_ctrl_c_the_instant_a_stage_is_stored_still_names_it(tmp_path: Path, tiny_llama_dir: Path,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C after the engine's rename and before the runner noted it: the store says it is there, so it is
    named (the runner asks the store about the stage it was storing)."""
    from trtpipe.store.local import Store

    def interrupted_after_commit(self, kind, key, digest, seconds):  # noqa: ANN001, ANN202
        if kind == "engine":
            raise KeyboardInterrupt

    monkeypatch.setattr(Store, "log_built", interrupted_after_commit)
    err, store = _interrupted_build(tmp_path, tiny_llama_dir, capsys)
    [engine] = list(store.entries("engine"))
    [checkpoint] = list(store.entries("checkpoint"))
    assert f"engine {engine.digest}" in err and f"checkpoint {checkpoint.digest}" in err


def test_ctrl_c_elsewhere_is_one_line_130(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import trtpipe.store.verify

    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(trtpipe.store.verify, "verify_store", interrupted)
    monkeypatch.setenv("TRTPIPE_HOME", str(Path(os.environ.get("PYTEST_TMP", "/tmp")) / f"trtpipe-ctrl-c-{os.getpid()}"))
    assert main(["cache", "verify"]) == 130
    assert capsys.readouterr().err.strip() == ("interrupted: nothing half-written (every write is to a temporary "
                                               "place, then renamed)")


# --------------------------------------------------------------------------- serve: one code per kind of mistake


def test_serve_answers_2_for_anything_that_is_not_a_published_repository(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    for target in (tmp_path / "missing", empty, a_file):
        assert main(["serve", str(target)]) == 2, target
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("error: ") and "Traceback" not in err
        assert re.search(r"is not a (directory|repository trtpipe published)", err), err


def test_ctrl_c_in_build_reads_the_runners_report_when_it_hands_one_over(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A runner may raise a KeyboardInterrupt carrying its report (hits and builds so far): those are named."""
    import types

    import trtpipe.pipeline

    class WithReport(KeyboardInterrupt):
        report = types.SimpleNamespace(artifacts={"checkpoint": "sha256:" + "1" * 64, "engine": "sha256:" + "2" * 64})

    def interrupted_build(*_args, **_kwargs):
        raise WithReport

    monkeypatch.setattr(trtpipe.pipeline, "run_build", interrupted_build)
    assert main(["build", str(tmp_path / "spec.yaml"), "--store", str(tmp_path / "store")]) == 130
    err = capsys.readouterr().err
    assert f"checkpoint sha256:{'1' * 64}, engine sha256:{'2' * 64}" in err


def test_store_option_moves_the_whole_workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """--store DIR is where results, channels, the audit trail and the store all are; $TRTPIPE_HOME is untouched."""
    from trtpipe.store.local import Store

    home, other = tmp_path / "home", tmp_path / "other"
    monkeypatch.setenv("TRTPIPE_HOME", str(home))
    monkeypatch.setenv("TRTPIPE_USER", "tester")
    monkeypatch.delenv("TRTPIPE_STORE", raising=False)
    # A hand-recorded result counts only where the trust policy allows it (issue 18).
    policy = tmp_path / "policy.yaml"
    policy.write_text("default:\n  require_signature: false\nchannels:\n  dev:\n    require_signature: false\n"
                      "    allow_hand_recorded: true\n")
    monkeypatch.setenv("TRTPIPE_POLICY", str(policy))
    store = Store.open(other)
    with store.building("repository", "r" * 16) as b:
        (b.dir / "trtpipe.json").write_text("{}")
        entry = b.commit(inputs={"name": "m", "target": {"gpu": "cpu-reference"}})
    assert main(["results", "record", entry.digest, "--kind", "smoke", "--passed", "--store", str(other)]) == 0
    assert main(["promote", entry.digest, "--to", "dev", "--store", str(other), "--json"]) == 0
    capsys.readouterr()
    assert main(["channels", "--json", "--store", str(other)]) == 0
    (state,) = json.loads(capsys.readouterr().out)["channels"]
    assert (state["channel"], state["digest"]) == ("dev", entry.digest)
    assert main(["cache", "rm", entry.digest, "--store", str(other)]) == 4  # pinned by dev, in that workspace
    assert (other / "results").is_dir() and (other / "audit" / "audit.jsonl").is_file()
    assert not home.exists()
    # Without --store the same commands see the (empty) default workspace.
    assert main(["channels", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["channels"] == []
