"""trtpipe as pip installs it: the wheel and sdist `python -m build` makes, and the wheel installed into a fresh
virtual environment that cannot see the checkout, running the tiny cpu-reference flow from a folder elsewhere.

The build runs on a copy of the checkout's files (tracked, and untracked ones git does not ignore: what a
fresh clone plus this change holds), so nothing beside the copy can leak into the wheel and the checkout gets
no build/ or egg-info. `python -m build` makes the sdist, then the wheel from the unpacked sdist (its default),
so the wheel also proves the sdist complete. It runs without build isolation (the dev extra pins `build` and
setuptools): an isolated build would download setuptools twice per run, and its only difference, a private
build environment, is not what this test is about.

The fresh venv is made by `python -m venv --without-pip`; the wheel goes in with this environment's pip
(`pip --python VENV/bin/python install --no-deps --no-index WHEEL`, so the entry point's shebang is the fresh
interpreter), and the dependencies come from this environment's site-packages as symlinks, one per entry,
leaving out every entry of trtpipe itself (the editable install's .pth and finder, its dist-info). So the
fresh interpreter imports numpy, torch ... from here and trtpipe only from the wheel, without a second
multi-GB install. The Triton stubs pick the first `python3` on PATH (shared/notes/triton-on-cpu.md), which
`trtpipe serve` sets to the fresh venv's bin/.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import sysconfig
import tarfile
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.package, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
ROOT_FOLDERS = ("build_configs", "triton_repo")  # at the repository root; inside the package in the wheel
# Generous deadlines for a loaded 2-core runner (seconds); every wait also ends when the process does.
BUILD_WHEEL_S = 600
COMMAND_S = 900
SERVE_READY_S = 600


def _git_files(*paths: str) -> list[str]:
    """Files git tracks, plus untracked ones it does not ignore, under `paths` (all when none), repo-relative."""
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard",
                          "--", *paths], capture_output=True, check=True, timeout=120).stdout
    return sorted({name for name in out.decode().split("\0") if name and (ROOT / name).is_file()})


def _version() -> str:
    """The version as the source writes it (trtpipe/__init__.py), read without importing the package."""
    import ast

    tree = ast.parse((ROOT / "trtpipe" / "__init__.py").read_text())
    values = [node.value.value for node in tree.body if isinstance(node, ast.Assign)
              and any(getattr(t, "id", None) == "__version__" for t in node.targets)]
    assert len(values) == 1, "trtpipe/__init__.py must assign __version__ once"
    return values[0]


@dataclass(frozen=True)
class Built:
    wheel: Path
    sdist: Path


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    if subprocess.run(["git", "-C", str(ROOT), "rev-parse"], capture_output=True).returncode != 0:
        pytest.skip("not a git checkout: the package is built from the checkout's files")
    try:
        import build  # noqa: F401
    except ImportError:  # a failure, not a skip: this is the package's acceptance test
        pytest.fail("the `build` package is missing: install the dev extra (bash scripts/install.sh --test)")
    work = tmp_path_factory.mktemp("package-build")
    source, dist = work / "source", work / "dist"
    for name in _git_files():
        target = source / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((ROOT / name).read_bytes())
        target.chmod((ROOT / name).stat().st_mode & 0o777)
    result = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(source)],
                            capture_output=True, text=True, timeout=BUILD_WHEEL_S, cwd=work)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    wheels, sdists = sorted(dist.glob("*.whl")), sorted(dist.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, sorted(p.name for p in dist.iterdir())
    return Built(wheel=wheels[0], sdist=sdists[0])


@dataclass(frozen=True)
class FreshVenv:
    root: Path
    bin: Path
    site_packages: Path
    env: dict[str, str]  # the environment its commands run with: no TRTPIPE_* but a private home, no PYTHONPATH
    work: Path  # the working directory its commands run in, outside the checkout

    def run(self, *args: str, timeout: float = COMMAND_S) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.bin / "trtpipe"), *args], capture_output=True, text=True, env=self.env,
                              cwd=self.work, timeout=timeout)


@pytest.fixture(scope="session")
def fresh_venv(built: Built, dependency_venvs, tmp_path_factory: pytest.TempPathFactory) -> FreshVenv:
    root = tmp_path_factory.mktemp("fresh") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=300)
    python = root / "bin" / "python"
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check",
                              "install", "--no-deps", "--no-index", str(built.wheel)],
                             capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    dependency_venvs.link(root)
    site_packages = dependency_venvs.purelib(root)
    assert site_packages != Path(sysconfig.get_path("purelib"))
    work = tmp_path_factory.mktemp("elsewhere")
    assert ROOT not in work.parents and work != ROOT
    this_bin = str(Path(sys.executable).parent)
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != this_bin)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TRTPIPE_") and k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV",
                                                         "PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
    env.update(PATH=str(root / "bin") + os.pathsep + path, TRTPIPE_HOME=str(work / "home"),
               TRTPIPE_USER="package-test", OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"))
    return FreshVenv(root=root, bin=root / "bin", site_packages=site_packages, env=env, work=work)


# ------------------------------------------------------------------------------------------ what the files hold
def test_the_wheel_and_the_sdist_carry_every_data_file_trtpipe_reads(built: Built) -> None:
    """Every file of build_configs/ and triton_repo/ git has (so a table added later cannot be forgotten), and
    of trtpipe/ itself: the wheel holds them inside the package, the sdist where the checkout has them."""
    version = _version()
    wheel_names = set(zipfile.ZipFile(built.wheel).namelist())
    with tarfile.open(built.sdist) as sdist:
        sdist_names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    root_files = _git_files(*ROOT_FOLDERS)
    package_files = [name for name in _git_files("trtpipe") if "__pycache__" not in name]
    assert {"build_configs/toolchains.yaml", "build_configs/gpus.yaml",
            "triton_repo/tensorrt_llm_reference/1/model.py"} <= set(root_files)
    assert "trtpipe/data/report/release.html.j2" in package_files
    assert sorted(f for f in root_files if f"trtpipe/{f}" not in wheel_names) == []
    assert sorted(f for f in package_files if f not in wheel_names) == []
    assert sorted(f for f in root_files + package_files if f not in sdist_names) == []
    # Nothing else lands in site-packages: only the package and its metadata, no stray top-level folders.
    assert {name.split("/")[0] for name in wheel_names} == {"trtpipe", f"trtpipe-{version}.dist-info"}
    assert [name for name in wheel_names if "__pycache__" in name or name.endswith(".pyc")] == []


def test_the_version_is_written_once(built: Built) -> None:
    """pyproject.toml takes the version from trtpipe/__init__.py: the wheel's and the sdist's metadata say it."""
    version = _version()
    assert built.wheel.name == f"trtpipe-{version}-py3-none-any.whl" and built.sdist.name == f"trtpipe-{version}.tar.gz"
    metadata = zipfile.ZipFile(built.wheel).read(f"trtpipe-{version}.dist-info/METADATA").decode()
    assert f"\nVersion: {version}\n" in metadata
    assert 'version = "' not in (ROOT / "pyproject.toml").read_text()


# ------------------------------------------------------------------------------------------ the installed wheel
def _toolchain_table() -> list[dict]:
    """The lines of the checkout's toolchains.yaml, read here with PyYAML (not through trtpipe)."""
    return yaml.safe_load((ROOT / "build_configs" / "toolchains.yaml").read_text())["toolchains"]


def _pinned_toolchains() -> list[tuple[str, str]]:
    """(name, TensorRT-LLM version) of every line, in the file's order (oldest first)."""
    return [(t["name"], t["trtllm_version"]) for t in _toolchain_table()]


def _spec(folder: Path, model: Path) -> Path:
    spec = folder / "tiny.yaml"
    spec.write_text(f"name: tiny-package-test\nmodel:\n  path: {model}\n  dtype: float16\ntarget:\n  gpu: cpu-reference\n"
                    "engine:\n  max_batch_size: 2\n  max_input_len: 64\n  max_seq_len: 128\ntriton:\n  streaming: true\n")
    return spec


def test_the_fresh_interpreter_sees_only_the_installed_trtpipe(fresh_venv: FreshVenv) -> None:
    probe = ("import importlib.metadata as m, json, sys, trtpipe, trtpipe.shipped as s; "
             "print(json.dumps({'file': trtpipe.__file__, 'version': trtpipe.__version__, "
             "'metadata': m.version('trtpipe'), 'dists': [str(d._path) for d in m.distributions() "
             "if d.metadata['Name'] == 'trtpipe'], 'path': sys.path, 'configs': str(s.shipped_build_configs_dir())}))")
    result = subprocess.run([str(fresh_venv.bin / "python"), "-c", probe], capture_output=True, text=True,
                            env=fresh_venv.env, cwd=fresh_venv.work, timeout=300)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert Path(seen["file"]).parent == fresh_venv.site_packages / "trtpipe"
    assert seen["version"] == seen["metadata"] == _version()
    assert [Path(d).parent for d in seen["dists"]] == [fresh_venv.site_packages]
    assert [p for p in seen["path"] if p and Path(p).resolve().is_relative_to(ROOT)] == []
    assert Path(seen["configs"]) == fresh_venv.site_packages / "trtpipe" / "build_configs"


def test_version_names_the_pinned_toolchains(fresh_venv: FreshVenv) -> None:
    pinned = _pinned_toolchains()
    text = fresh_venv.run("--version")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0] == f"trtpipe {_version()}"
    for name, trtllm in pinned:
        assert any(line.split()[:2] == [name, trtllm] for line in lines), (name, text.stdout)
    as_json = fresh_venv.run("--version", "--json")
    assert as_json.returncode == 0, as_json.stderr
    info = json.loads(as_json.stdout)
    assert info["ok"] is True and info["trtpipe"] == _version()
    assert [(t["name"], t["trtllm_version"]) for t in info["toolchains"]] == pinned
    package = fresh_venv.site_packages / "trtpipe"
    assert info["data"] == {"package": str(package), "build_configs": str(package / "build_configs"),
                            "build_configs_from": "package", "triton_repo": str(package / "triton_repo"),
                            "triton_repo_from": "package"}


def _read_lines(stream, into: queue.Queue) -> None:
    for line in stream:
        into.put(line)
    into.put(None)  # the process closed its stdout: it has exited or is exiting


@dataclass(frozen=True)
class InstalledBuild:
    spec: Path
    repository: Path
    artifacts: dict[str, str]  # stage -> digest, as `build --json` reports them


@pytest.fixture(scope="session")
def installed_build(fresh_venv: FreshVenv) -> InstalledBuild:
    """example-model -> check -> build (cpu-reference) with the installed entry point, run from a folder outside
    the checkout with TRTPIPE_BUILD_CONFIGS unset."""
    model = fresh_venv.work / "tiny-llama"
    made = fresh_venv.run("example-model", str(model))
    assert made.returncode == 0, made.stderr
    spec = _spec(fresh_venv.work, model)

    check = fresh_venv.run("check", "--spec", str(spec), "--json")
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr
    report = json.loads(check.stdout)
    stable = [t["name"] for t in _toolchain_table() if not t.get("preview")]
    assert report["toolchain"] == stable[-1]  # a spec without a toolchain gets the newest stable line

    build = fresh_venv.run("build", str(spec), "--json")
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    outcome = json.loads(build.stdout)
    repository = Path(outcome["repository_path"])
    assert repository.is_relative_to(Path(fresh_venv.env["TRTPIPE_HOME"]))
    # The serving code published is the wheel's copy of triton_repo/ (the same bytes as the checkout's).
    for model_name, source in (("tensorrt_llm", "tensorrt_llm_reference"), ("preprocessing", "preprocessing")):
        assert (repository / model_name / "1" / "model.py").read_bytes() == \
            (ROOT / "triton_repo" / source / "1" / "model.py").read_bytes()
    return InstalledBuild(spec=spec, repository=repository, artifacts=outcome["artifacts"])


def test_a_wheel_install_builds_what_the_checkout_builds(installed_build: InstalledBuild, fresh_venv: FreshVenv,
                                                         tmp_path: Path) -> None:
    """The same spec and model built by the checkout's trtpipe (this environment's editable install) into another
    home: the same checkpoint, engine and repository digests. Where trtpipe is installed is no part of a key, so
    a CI job on the wheel and a laptop on a checkout share one cache."""
    env = dict(fresh_venv.env, TRTPIPE_HOME=str(tmp_path / "checkout-home"))
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env["PATH"]
    build = subprocess.run([sys.executable, "-m", "trtpipe.cli", "build", str(installed_build.spec), "--json"],
                           capture_output=True, text=True, env=env, cwd=tmp_path, timeout=COMMAND_S)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    ours = json.loads(build.stdout)
    assert not Path(ours["repository_path"]).is_relative_to(Path(fresh_venv.env["TRTPIPE_HOME"]))
    assert ours["artifacts"] == installed_build.artifacts and set(ours["artifacts"]) >= {"checkpoint", "engine"}


def test_the_installed_wheel_serves_and_smokes_the_tiny_model_outside_the_checkout(
        installed_build: InstalledBuild, fresh_venv: FreshVenv) -> None:
    """serve and smoke (with parity) with the installed entry point, on the repository it built."""
    spec, repository = installed_build.spec, installed_build.repository
    log = fresh_venv.work / "serve.stderr"
    with log.open("w") as stderr:  # a file, not a pipe nobody reads: a chatty serve must not block on it
        server = subprocess.Popen([str(fresh_venv.bin / "trtpipe"), "serve", str(repository), "--json",
                                   "--probe-interval", "0"], stdout=subprocess.PIPE, stderr=stderr, text=True,
                                  env=fresh_venv.env, cwd=fresh_venv.work, start_new_session=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_read_lines, args=(server.stdout, lines), daemon=True).start()
    try:
        first = lines.get(timeout=SERVE_READY_S)
        assert first is not None, f"serve exited {server.wait(timeout=60)}: {log.read_text()[-3000:]}"
        ready = json.loads(first)
        assert ready["event"] == "ready", ready
        assert ready["repository_digest"] == installed_build.artifacts["repository"], ready
        _assert_stubs_use_the_fresh_venv(fresh_venv, ready["pid"])
        smoke = fresh_venv.run("smoke", ready["grpc_url"], "--parity", str(spec), "--json")
        assert smoke.returncode == 0, smoke.stdout[-3000:] + smoke.stderr[-3000:]
        result = json.loads(smoke.stdout)
        assert result["passed"] is True and result["parity"] is not None
        assert [c["name"] for c in result["checks"] if not c["passed"]] == []
    finally:
        server.terminate()  # serve's SIGTERM handler stops tritonserver and its stubs
        try:
            code = server.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)  # leave nothing running, then fail
            raise
    assert code == 0, log.read_text()[-3000:]


def _assert_stubs_use_the_fresh_venv(fresh_venv: FreshVenv, server_pid: int) -> None:
    """Each Python-backend stub runs the first python3 on its PATH (shared/notes/triton-on-cpu.md): that is the
    fresh venv's, and that interpreter, in the stub's own environment and folder, imports the installed trtpipe."""
    import psutil

    stubs = [p for p in psutil.Process(server_pid).children(recursive=True)
             if "triton_python_backend_stub" in " ".join(p.cmdline())]
    assert stubs, "tritonserver started no Python-backend stub"
    for stub in stubs:
        environ = stub.environ()
        first_python = next(Path(d) / "python3" for d in environ["PATH"].split(os.pathsep)
                            if (Path(d) / "python3").exists())
        assert first_python == fresh_venv.bin / "python3", environ["PATH"]
        imported = subprocess.run([str(first_python), "-c", "import trtpipe.reference.runtime as r; print(r.__file__)"],
                                  capture_output=True, text=True, env=environ, cwd=stub.cwd(), timeout=300)
        assert imported.returncode == 0, imported.stderr
        assert Path(imported.stdout.strip()).is_relative_to(fresh_venv.site_packages / "trtpipe"), imported.stdout
