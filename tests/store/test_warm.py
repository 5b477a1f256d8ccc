"""The warm path (trtpipe.warm): a second `trtpipe build` of an unchanged spec reuses the first build's
resolution from its memo, and every kind of change to what a key or a plan reads makes it resolve again.

Most tests drive the CLI in this process (`trtpipe.cli.main`) with the racy rule's window set to 0: their
inputs are written a moment before the build, and a real window would refuse the memo (one test checks
that it does). The subprocess tests keep the real window and wait it out once.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from trtpipe import build_record, hostfacts, warm
from trtpipe.cli import main
from trtpipe.pipeline import run_build
from trtpipe.settings import Settings
from trtpipe.shipped import build_configs_dir
from trtpipe.store.digest_cache import RACY_WINDOW_NS
from trtpipe.store.local import Store

pytestmark = pytest.mark.timeout(900)

REPO = Path(__file__).resolve().parents[2]
SETTLE_S = RACY_WINDOW_NS / 1e9 + 0.2  # inputs older than the racy window may enter a memo

SPEC = """\
model:
  path: {model}
target:
  gpu: cpu-reference
engine:
  max_batch_size: 4
  max_input_len: 64
  max_seq_len: 128
"""


def _configs() -> Path:
    """The build_configs/ folder a command run now would read (the CLI reads TRTPIPE_BUILD_CONFIGS as this does)."""
    return build_configs_dir(Settings.from_env())


@pytest.fixture(scope="module")
def built_store(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store holding the tiny spec's three stages (the cold build, done once for the module)."""
    folder = tmp_path_factory.mktemp("warm-built")
    spec = folder / "tiny.yaml"
    spec.write_text(SPEC.format(model=tiny_llama_dir))
    report = run_build(spec, store=folder / "home", progress=False, settings=Settings.from_env())
    assert report.status == "ok"
    return folder / "home"


def _copy_store(src: Path, dst: Path) -> Path:
    subprocess.run(["cp", "-a", str(src), str(dst)], check=True)  # keeps the hard links
    return dst


class Workspace:
    """A private copy of the model, spec, store, build_configs and templates, built through the CLI."""

    def __init__(self, tmp: Path, model: Path, home: Path, configs: Path, templates: Path,
                 capsys: pytest.CaptureFixture[str]) -> None:
        self.tmp, self.model, self.home, self.configs, self.templates = tmp, model, home, configs, templates
        self.spec = tmp / "tiny.yaml"
        self.spec.write_text(SPEC.format(model=model))
        self.capsys = capsys

    def build(self, *flags: str) -> dict:
        self.capsys.readouterr()
        code = main(["build", str(self.spec), "--json", "--store", str(self.home), *flags])
        out = self.capsys.readouterr()
        assert code == 0, out.err
        return json.loads(out.out)

    def memo(self) -> Path:
        return warm.memo_path(self.home, os.path.realpath(self.spec))

    def primed(self) -> dict:
        """Build once the normal way (it leaves the memo) and once from the memo; the memo's report."""
        first = self.build()
        assert outcomes(first)[:2] == ["ran", "ran"] and self.memo().is_file()
        second = self.build()
        assert outcomes(second) == ["hit"] * 5, second
        return second


def outcomes(report: dict) -> list[str]:
    return [s["outcome"] for s in report["stages"]]


@pytest.fixture
def ws(tmp_path: Path, tiny_llama_dir: Path, built_store: Path, monkeypatch: pytest.MonkeyPatch,
       capsys: pytest.CaptureFixture[str]) -> Workspace:
    from trtpipe.serving import templates
    from trtpipe.shipped import shipped_build_configs_dir

    monkeypatch.setattr(warm, "RACY_WINDOW_NS", 0)  # inputs written just now count as settled
    model = shutil.copytree(tiny_llama_dir, tmp_path / "tiny-llama")
    configs = shutil.copytree(shipped_build_configs_dir(), tmp_path / "build_configs")
    monkeypatch.setenv("TRTPIPE_BUILD_CONFIGS", str(configs))
    template_copy = shutil.copytree(templates.TEMPLATE_ROOT, tmp_path / "triton_repo")
    monkeypatch.setattr(templates, "TEMPLATE_ROOT", template_copy)
    home = _copy_store(built_store, tmp_path / "home")
    return Workspace(tmp_path, model, home, configs, template_copy, capsys)


# ----------------------------------------------------------------------------------------- the memo is used


def test_an_unchanged_spec_reuses_its_resolution_and_reports_and_records_the_same(ws: Workspace) -> None:
    normal = ws.build()
    assert outcomes(normal) == ["ran", "ran", "hit", "hit", "hit"]
    fast = ws.build()
    assert outcomes(fast) == ["hit", "hit", "hit", "hit", "hit"]
    assert "last resolution reused" in fast["stages"][0]["detail"]
    assert fast["stages"][0]["detail"].startswith(normal["stages"][0]["detail"])
    # The same report but for times, record and resolve/plan's outcome and detail.
    def same(report: dict) -> dict:
        kept = {k: v for k, v in report.items() if k not in ("seconds", "record_path", "stages")}
        return {**kept, "stages": [{k: v for k, v in s.items() if k not in ("seconds", "outcome", "detail")}
                                   for s in report["stages"]]}
    assert same(fast) == same(normal)
    assert [s["detail"] for s in fast["stages"][2:]] == [s["detail"] for s in normal["stages"][2:]]
    # The record repeats the resolving build's resolution, and history lists both builds.
    normal_record = json.loads(Path(normal["record_path"]).read_text())
    fast_record = json.loads(Path(fast["record_path"]).read_text())
    for field in ("toolchain", "spec", "memory_plan", "versions", "keys", "artifacts", "repository_path", "status",
                  "spec_path", "model", "target"):
        assert fast_record[field] == normal_record[field], field
    assert [s["outcome"] for s in fast_record["stages"]] == ["hit"] * 5
    records = build_record.read_records(ws.home, model=normal_record["model"])
    assert {r.id for r in records} >= {normal_record["id"], fast_record["id"]}
    # The warm path took the leases and touched the manifests as a hit does (gc's last-used time).
    for stage in fast["stages"][2:]:
        kind = "repository" if stage["name"] == "publish" else stage["name"]
        assert (ws.home / "locks" / kind / f"{stage['key']}.lease").is_file()


def test_the_fast_path_prints_the_same_lines(ws: Workspace, capsys: pytest.CaptureFixture[str]) -> None:
    ws.primed()

    def human(*flags: str) -> pytest.CaptureResult[str]:
        capsys.readouterr()
        assert main(["build", str(ws.spec), "--store", str(ws.home), *flags]) == 0
        return capsys.readouterr()

    fast, normal = human(), human("--verify")  # --verify always resolves
    fast_lines, normal_lines = fast.err.splitlines(), normal.err.splitlines()
    # the spec is in the earlier shape (engine:): both say so, after the resolve line
    notes = [line for line in normal_lines if line.strip().startswith("note:")]
    assert notes and "earlier spec shape" in notes[0] and [line for line in fast_lines if line in notes] == notes
    fast_lines = [line for line in fast_lines if line not in notes]
    normal_lines = [line for line in normal_lines if line not in notes]
    assert [line.split()[:2] for line in fast_lines if line.startswith("  ")] == [
        ["resolve", "hit"], ["plan", "hit"], ["checkpoint", "hit"], ["engine", "hit"], ["publish", "hit"]]
    assert [line.split()[:2] for line in normal_lines if line.startswith("  ")] == [
        ["resolve", "ran"], ["plan", "ran"], ["checkpoint", "hit"], ["engine", "hit"], ["publish", "hit"]]
    assert len(fast_lines) == len(normal_lines)
    assert fast_lines[-1].startswith("build ok in") and fast_lines[-2] == normal_lines[-2]  # repository: PATH
    assert fast.out == normal.out  # the repository path and the three artifact digests


def test_a_warm_cli_build_imports_nothing_that_resolves(tiny_llama_dir: Path, built_store: Path, tmp_path: Path) -> None:
    """The real CLI in a subprocess, with the real racy window: the second build takes the fast path and
    imports neither resolve, plan, the spec loader, YAML, the stages nor filelock."""
    model = shutil.copytree(tiny_llama_dir, tmp_path / "tiny-llama")
    spec = tmp_path / "tiny.yaml"
    spec.write_text(SPEC.format(model=model))
    home = _copy_store(built_store, tmp_path / "home")
    time.sleep(SETTLE_S)
    env = dict(os.environ, TRTPIPE_HOME=str(home), PYTHONPATH=str(REPO))
    first = subprocess.run([sys.executable, "-m", "trtpipe.cli", "build", str(spec), "--json"], env=env,
                           capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    assert outcomes(json.loads(first.stdout))[:2] == ["ran", "ran"]
    script = (
        "import sys\nfrom trtpipe.cli import main\ncode = main(['build', sys.argv[1], '--json'])\n"
        "names = ('yaml', 'filelock', 'trtpipe.resolve', 'trtpipe.plan', 'trtpipe.spec', 'trtpipe.spec_loader',\n"
        "         'trtpipe.stages', 'trtpipe.pipeline', 'trtpipe.trtllm_build', 'trtpipe.datafiles', 'torch')\n"
        "print('LOADED=' + ','.join(n for n in names if n in sys.modules), file=sys.stderr)\nsys.exit(code)\n"
    )
    second = subprocess.run([sys.executable, "-c", script, str(spec)], env=env, capture_output=True, text=True,
                            timeout=300)
    assert second.returncode == 0, second.stderr
    assert outcomes(json.loads(second.stdout)) == ["hit"] * 5
    assert second.stderr.strip().splitlines()[-1] == "LOADED=", second.stderr[-800:]


def test_the_library_build_is_the_cli_s_and_takes_the_memo_as_it_does(ws: Workspace) -> None:
    """`build_session.build` is what `trtpipe build` calls: the same report, and the memo on an unchanged spec;
    a request that forces a stage resolves (the memo never forces)."""
    from trtpipe.build_session import BuildRequest, build
    from trtpipe.workspace import Workspace as Home

    cli = ws.primed()
    workspace = Home(ws.home, settings=Settings.from_env())
    try:
        again = build(workspace, BuildRequest(spec=ws.spec), progress=False)
        assert [s.outcome for s in again.stages] == ["hit"] * 5
        assert again.keys == cli["keys"] and again.artifacts == cli["artifacts"]
        forced = build(workspace, BuildRequest(spec=ws.spec, force=("publish",)), progress=False)
        assert [s.outcome for s in forced.stages] == ["ran", "ran", "hit", "hit", "built"]
        assert forced.keys == cli["keys"]
    finally:
        workspace.close()


# ----------------------------------------------------------------------------------------- every change resolves again


def test_a_spec_edit_resolves_again_and_rebuilds_what_it_changes(ws: Workspace) -> None:
    before = ws.primed()
    ws.spec.write_text(ws.spec.read_text().replace("max_batch_size: 4", "max_batch_size: 2"))
    with pytest.raises(warm.Stale, match="changed"):
        warm.check_memo(ws.spec, ws.home, _configs())
    after = ws.build()
    assert outcomes(after) == ["ran", "ran", "hit", "built", "built"]
    assert after["keys"]["checkpoint"] == before["keys"]["checkpoint"]
    assert after["keys"]["engine"] != before["keys"]["engine"]
    assert outcomes(ws.build())[:2] == ["hit", "hit"]  # the new memo


def test_a_config_json_edit_with_its_mtime_put_back_resolves_again(ws: Workspace) -> None:
    before = ws.primed()
    config = ws.model / "config.json"
    st = config.stat()
    text = config.read_text()
    assert '"rope_theta": 10000.0' in text
    config.write_text(text.replace('"rope_theta": 10000.0', '"rope_theta": 20000.0'))  # same size
    os.utime(config, ns=(st.st_atime_ns, st.st_mtime_ns))
    after_st = config.stat()
    assert (after_st.st_size, after_st.st_mtime_ns) == (st.st_size, st.st_mtime_ns) and after_st.st_ctime_ns != st.st_ctime_ns
    with pytest.raises(warm.Stale, match="changed"):
        warm.check_memo(ws.spec, ws.home, _configs())
    after = ws.build()
    assert outcomes(after) == ["ran", "ran", "built", "built", "built"]
    assert after["keys"]["checkpoint"] != before["keys"]["checkpoint"]


def test_a_build_configs_table_edit_resolves_again(ws: Workspace) -> None:
    ws.primed()
    table = ws.configs / "toolchains.yaml"
    table.write_text(table.read_text() + "# an edit\n")
    with pytest.raises(warm.Stale, match="toolchains.yaml changed"):
        warm.check_memo(ws.spec, ws.home, _configs())
    assert outcomes(ws.build()) == ["ran", "ran", "hit", "hit", "hit"]


def test_another_build_configs_folder_resolves_again(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    ws.primed()
    monkeypatch.delenv("TRTPIPE_BUILD_CONFIGS")
    with pytest.raises(warm.Stale, match="another place"):
        warm.check_memo(ws.spec, ws.home, _configs())
    assert outcomes(ws.build())[:2] == ["ran", "ran"]


def test_a_template_edit_resolves_again_and_republishes(ws: Workspace) -> None:
    before = ws.primed()
    template = ws.templates / "ensemble" / "config.pbtxt"
    template.write_text(template.read_text() + "\n# an edit\n")
    with pytest.raises(warm.Stale, match="config.pbtxt changed"):
        warm.check_memo(ws.spec, ws.home, _configs())
    after = ws.build()
    assert outcomes(after) == ["ran", "ran", "hit", "hit", "built"]
    assert after["keys"]["publish"] != before["keys"]["publish"]


def test_a_trtpipe_source_edit_resolves_again(tiny_llama_dir: Path, built_store: Path, tmp_path: Path) -> None:
    """A copy of the source tree run by the real CLI: editing one module makes the next build resolve."""
    src = tmp_path / "src"
    for name in ("trtpipe", "build_configs", "triton_repo"):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    model = shutil.copytree(tiny_llama_dir, tmp_path / "tiny-llama")
    spec = tmp_path / "tiny.yaml"
    spec.write_text(SPEC.format(model=model))
    home = _copy_store(built_store, tmp_path / "home")
    time.sleep(SETTLE_S)
    env = dict(os.environ, TRTPIPE_HOME=str(home), PYTHONPATH=str(src))
    env.pop("TRTPIPE_BUILD_CONFIGS", None)

    def build() -> tuple[dict, str]:
        done = subprocess.run([sys.executable, "-m", "trtpipe.cli", "build", str(spec), "--json"], env=env,
                              cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout), done.stderr

    probe = subprocess.run([sys.executable, "-c", "import trtpipe; print(trtpipe.__file__)"], env=env, cwd=tmp_path,
                           capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == str(src / "trtpipe" / "__init__.py")
    assert outcomes(build()[0])[:2] == ["ran", "ran"]
    assert outcomes(build()[0]) == ["hit"] * 5
    module = src / "trtpipe" / "quant.py"
    module.write_text(module.read_text() + "\n# an edit\n")
    report, _ = build()
    assert outcomes(report) == ["ran", "ran", "hit", "hit", "hit"]
    memo = json.loads(warm.memo_path(home, os.path.realpath(spec)).read_text())
    assert memo["roots"]["trtpipe"] == str(src / "trtpipe") and "quant.py" in memo["trees"]["trtpipe"]


def test_a_spec_path_that_now_leads_elsewhere_resolves_again(ws: Workspace) -> None:
    link = ws.tmp / "current"
    link.symlink_to(ws.model)
    ws.spec.write_text(SPEC.format(model="current"))  # relative: resolved against the spec's folder
    ws.primed()
    other = shutil.copytree(ws.model, ws.tmp / "b" / ws.model.name)  # same name: the artifact's name follows it
    link.unlink()
    link.symlink_to(other)
    with pytest.raises(warm.Stale, match="leads elsewhere"):
        warm.check_memo(ws.spec, ws.home, _configs())
    assert outcomes(ws.build()) == ["ran", "ran", "hit", "hit", "hit"]  # same bytes: same keys


def test_a_removed_entry_resolves_again_and_is_rebuilt(ws: Workspace) -> None:
    before = ws.primed()
    store = Store.open(ws.home)
    entry = store.get("engine", before["keys"]["engine"])
    assert entry is not None and store.remove(entry)
    after = ws.build()
    assert outcomes(after) == ["ran", "ran", "hit", "built", "hit"]
    assert after["artifacts"] == before["artifacts"]  # the reference engine is rebuilt to the same bytes


def test_a_damaged_entry_is_quarantined_and_rebuilt(ws: Workspace) -> None:
    before = ws.primed()
    entry_dir = Path(before["stages"][2]["path"])
    damaged = entry_dir / "config.json"  # the checkpoint's own file (its weights are shared with the engine's)
    os.chmod(damaged, 0o644)
    with open(damaged, "r+b") as handle:
        handle.truncate(damaged.stat().st_size - 1)
    after = ws.build()
    assert outcomes(after) == ["ran", "ran", "built", "hit", "hit"]
    assert "quarantine" in (after["stages"][2]["detail"] or "")
    assert after["artifacts"] == before["artifacts"]


def test_verify_force_and_dry_run_take_the_normal_path(ws: Workspace) -> None:
    ws.primed()
    assert outcomes(ws.build("--verify")) == ["ran", "ran", "hit", "hit", "hit"]
    assert outcomes(ws.build("--force", "publish")) == ["ran", "ran", "hit", "hit", "built"]
    assert outcomes(ws.build("--dry-run")) == ["ran", "ran", "hit", "hit", "hit"]
    assert outcomes(ws.build()) == ["hit"] * 5


def test_host_facts_and_the_import_path_are_inputs(ws: Workspace, monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    ws.primed()
    with monkeypatch.context() as patch:
        patch.setattr(hostfacts, "memory_bytes", lambda: 1234 * 2**30)
        with pytest.raises(warm.Stale, match="memory"):
            warm.check_memo(ws.spec, ws.home, _configs())
    warm.check_memo(ws.spec, ws.home, _configs())
    packages = tmp_path / "packages"
    packages.mkdir()
    monkeypatch.setattr(sys, "path", [*sys.path, str(packages)])
    with pytest.raises(warm.Stale, match="import path"):
        warm.check_memo(ws.spec, ws.home, _configs())


def test_a_memo_that_does_not_parse_is_replaced(ws: Workspace) -> None:
    ws.primed()
    ws.memo().chmod(0o644)
    ws.memo().write_text('{"memo_version": 1, "spec": ')
    with pytest.raises(warm.Stale, match="unreadable"):
        warm.check_memo(ws.spec, ws.home, _configs())
    assert outcomes(ws.build())[:2] == ["ran", "ran"]
    assert outcomes(ws.build())[:2] == ["hit", "hit"]


# ----------------------------------------------------------------------------------------- when a memo is written


def test_inputs_changed_within_the_racy_window_leave_no_memo(tiny_llama_dir: Path, built_store: Path,
                                                           tmp_path: Path) -> None:
    """With the real window: a model copied a moment ago may still change within one timestamp tick."""
    model = shutil.copytree(tiny_llama_dir, tmp_path / "tiny-llama")
    spec = tmp_path / "tiny.yaml"
    spec.write_text(SPEC.format(model=model))
    home = _copy_store(built_store, tmp_path / "home")
    assert run_build(spec, store=home, progress=False, settings=Settings.from_env()).status == "ok"
    assert not warm.memo_path(home, os.path.realpath(spec)).exists()


def test_concurrent_memo_writers_leave_a_whole_memo(ws: Workspace) -> None:
    """Writers racing on one memo (as concurrent builds of one spec do) never leave a partial file: a reader
    sees a whole memo every time, and the survivor is used."""
    ws.primed()
    memo = ws.memo().read_text()
    errors: list[str] = []
    stop = threading.Event()

    def write() -> None:
        from trtpipe.atomic import write_text_atomically

        for _ in range(40):
            write_text_atomically(ws.memo(), memo, mode=0o644)

    def read() -> None:
        while not stop.is_set():
            try:
                warm.check_memo(ws.spec, ws.home, _configs())
            except warm.Stale as why:
                errors.append(str(why))

    reader = threading.Thread(target=read)
    reader.start()
    writers = [threading.Thread(target=write) for _ in range(3)]
    for thread in writers:
        thread.start()
    for thread in writers:
        thread.join()
    stop.set()
    reader.join()
    assert errors == []
    assert [p.name for p in ws.memo().parent.iterdir()] == [ws.memo().name]  # no temp file left
    assert outcomes(ws.build()) == ["hit"] * 5


def test_the_memo_covers_every_file_a_resolving_build_opens(ws: Workspace, tmp_path: Path) -> None:
    """Every file or folder a resolving warm build opens or lists (Python's audit events), apart from the
    store's own files and Python's, is fingerprinted by the memo that build leaves: a new input that
    resolve, plan or a stage key reads must be added to trtpipe.warm."""
    ws.primed()
    events = tmp_path / "events.json"
    script = f"""
import json, os, sys
from pathlib import Path
from trtpipe import warm
from trtpipe.pipeline import run_build
from trtpipe.settings import Settings
from trtpipe.serving import templates
templates.TEMPLATE_ROOT = Path({str(ws.templates)!r})  # as in this test's process
warm.RACY_WINDOW_NS = 0
seen, recording = [], [True]
def hook(event, args):
    if recording[0] and event in ("open", "os.listdir", "os.scandir") and args and isinstance(args[0], (str, bytes, os.PathLike)):
        seen.append(os.path.abspath(os.fsdecode(args[0])))
remember = warm.remember
warm.remember = lambda *a, **k: None  # the memo writer's own reads are not the build's
sys.addaudithook(hook)
report = run_build({str(ws.spec)!r}, store={str(ws.home)!r}, progress=False, settings=Settings.from_env())
recording[0] = False
warm.remember = remember
assert [s.outcome for s in report.stages][2:] == ["hit"] * 3
json.dump({{"seen": seen, "sys_path": [os.path.abspath(p) for p in sys.path], "cwd": os.getcwd()}},
          open({str(events)!r}, "w"))
"""
    env = dict(os.environ, TRTPIPE_BUILD_CONFIGS=str(ws.configs))
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    data = json.loads(events.read_text())
    memo = json.loads(ws.memo().read_text())
    covered = {memo["spec"]["path"], *memo["inputs"]}
    for folder, seen in memo["inputs"].items():
        covered |= {os.path.join(folder, name) for name in seen.get("entries", {})}
    roots = tuple(memo["roots"].values())
    assert memo["roots"]["templates"] == str(ws.templates)
    # Python's own folders (the import path is fingerprinted as a whole), except where trtpipe's roots are.
    python = {data["cwd"], sys.prefix, sys.base_prefix, *data["sys_path"]}
    uncovered = []
    for path in data["seen"]:
        if path in covered or path in python or "__pycache__" in path.split(os.sep):
            continue
        if any(path == r or path.startswith(r + os.sep) for r in roots):
            continue  # trtpipe's code and data, build_configs, the templates: every file fingerprinted
        if path.startswith((str(ws.home) + os.sep, "/proc/", "/dev/", "/sys/", "/etc/")):
            continue  # the store's own files; the system's
        if any(path.startswith(p + os.sep) for p in python if p not in ("/", str(REPO), data["cwd"])):
            continue  # Python's modules and installed packages
        uncovered.append(path)
    assert uncovered == [], uncovered


def test_what_the_memo_cannot_follow_leaves_no_memo() -> None:
    """A Hub model resolves through the Hugging Face cache, and a path inside a list or mapping has no single
    YAML text to re-resolve: neither is remembered (the build resolves every time)."""
    from types import SimpleNamespace

    from pydantic import BaseModel

    from trtpipe.build_report import BuildReport

    report = BuildReport(spec_path="spec.yaml", status="ok", record_path="records/x.json")
    hub = SimpleNamespace(spec=SimpleNamespace(model=SimpleNamespace(repo_id="org/model")))
    with pytest.raises(warm.Stale, match="Hugging Face cache"):
        warm.memo_of("spec.yaml", resolved=hub, report=report, stages=(), started_ns=0)  # type: ignore[arg-type]

    class Inner(BaseModel):
        files: list[Path] = [Path("a.txt")]

    class Outer(BaseModel):
        path: Path = Path("model")
        nested: dict[str, Inner] = {"x": Inner()}

    with pytest.raises(warm.Stale, match="nested holds paths"):
        list(warm._path_fields(Outer()))
    assert list(warm._path_fields(Inner.model_construct(files=[]))) == []
