"""Nothing below the CLI reads the environment (trtpipe.settings states the rule).

The shell builds the settings once per command (`Settings.from_env()`) and hands them down: trtpipe/cli.py,
trtpipe/commands/ (`commands.output.open_workspace` reads them for `Workspace.open`) and trtpipe/settings.py itself
may read the environment; every other module, the workspace included, takes a `Settings` (or the workspace) from
its caller. Read from the source
with `ast`: a call of trtpipe.settings' `from_env` (`Settings.from_env()`, or a `from_env` imported from
trtpipe.settings), and any read of `os.environ` / `os.environb` / `os.getenv` (also when imported by name
from os). `docker.from_env()` (the Docker SDK's client) is not trtpipe's and is not a read of a setting.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "trtpipe"

# What may read the environment: the shell, and the settings module.
SHELL = ("cli.py", "commands/", "settings.py")

# The reads below the CLI that stay, each (module, what it reads) -> why. None reads a trtpipe setting but the
# two process entries, each of which reads its own process's settings once, as the CLI does.
ALLOWED: dict[tuple[str, str], str] = {
    # DOCKER_HOST is the Docker CLI's own variable: where the daemon the docker executor talks to is.
    ("engine/executors/docker.py", "os.environ"): "DOCKER_HOST, the Docker daemon's address (Docker's variable)",
    # A local conversion child gets this process's environment (minus secrets: trtpipe.settings.child_environment),
    # with THIS trtpipe first on PYTHONPATH: passing the environment on, not reading a setting.
    ("engine/executors/local.py", "os.environ"): "the environment handed to a conversion child",
    # tokenizers' own switch, set (setdefault) before it forks: not read, and not trtpipe's.
    ("checkpoint/example_model.py", "os.environ"): "setdefault TOKENIZERS_PARALLELISM (the tokenizers library's)",
    # CUDA_VISIBLE_DEVICES (which GPUs the CUDA runtime shows) and setdefault CUBLAS_WORKSPACE_CONFIG
    # (deterministic cuBLAS): the CUDA runtime's variables, for the calibration this process runs.
    ("checkpoint/convert.py", "os.environ"): "CUDA_VISIBLE_DEVICES, setdefault CUBLAS_WORKSPACE_CONFIG (CUDA's)",
    # A Ray task is a process entry on its node, as the CLI is on the head: run_cell reads that node's settings
    # once (its own TRTPIPE_HOME, its registry credentials, which so never travel in a job) and passes them down.
    ("matrix/worker.py", "from_env"): "the Ray task's entry point reads its node's settings (run_cell)",
    # A conversion child (local or docker executor) is a process entry too: its executor sets TRTPIPE_BUILD_CONFIGS
    # to the build's tables (engine/executors), and the entry resolves the spec with them.
    ("engine/convert_entry.py", "from_env"): "the conversion child's entry point reads its own settings (main)",
}

ENV_ATTRIBUTES = {"environ", "environb", "getenv", "getenvb"}


def _in_shell(rel: str) -> bool:
    return any(rel == s or (s.endswith("/") and rel.startswith(s)) for s in SHELL)


def environment_reads(path: Path) -> list[tuple[int, str]]:
    """(line, what) for each read of the environment in one module: 'os.environ' (any of os.environ, environb,
    getenv), or 'from_env' (trtpipe.settings' `from_env`, as `Settings.from_env` or imported by name)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    os_names = {"os"}            # names bound to the os module
    os_members: set[str] = set()  # environ / getenv imported from os by name
    settings_modules: set[str] = set()  # names bound to trtpipe.settings
    from_env_names: set[str] = set()  # from trtpipe.settings import from_env [as x]
    settings_classes = {"Settings"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "os":
                    os_names.add(alias.asname or "os")
                elif alias.name == "trtpipe.settings" and alias.asname:
                    settings_modules.add(alias.asname)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            for alias in node.names:
                if node.module == "os" and alias.name in ENV_ATTRIBUTES:
                    os_members.add(alias.asname or alias.name)
                elif node.module == "trtpipe.settings" and alias.name == "from_env":
                    from_env_names.add(alias.asname or alias.name)
                elif node.module == "trtpipe.settings" and alias.name == "Settings":
                    settings_classes.add(alias.asname or alias.name)
                elif node.module == "trtpipe" and alias.name == "settings":
                    settings_modules.add(alias.asname or alias.name)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id in os_names and node.attr in ENV_ATTRIBUTES:
                found.append((node.lineno, "os.environ"))
            elif node.attr == "from_env" and (node.value.id in settings_classes or node.value.id in settings_modules):
                found.append((node.lineno, "from_env"))
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            if node.id in os_members:
                found.append((node.lineno, "os.environ"))
            elif node.id in from_env_names:
                found.append((node.lineno, "from_env"))
    return sorted(set(found))


def reads_below_the_cli(package: Path = PACKAGE, allowed: dict[tuple[str, str], str] | None = None) -> list[str]:
    """'path:line: what' for each read outside the shell that the allow-list does not name."""
    allowed = ALLOWED if allowed is None else allowed
    problems = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        if _in_shell(rel):
            continue
        for line, what in environment_reads(path):
            if (rel, what) not in allowed:
                problems.append(f"{rel}:{line}: reads the environment ({what}); take a Settings from the caller")
    return problems


def test_nothing_below_the_cli_reads_the_environment() -> None:
    assert reads_below_the_cli() == []


def test_every_allowed_read_is_still_there() -> None:
    """A read that went away leaves no stale exception behind."""
    here = {(p.relative_to(PACKAGE).as_posix(), what) for p in PACKAGE.rglob("*.py") for _, what in environment_reads(p)}
    assert sorted(set(ALLOWED) - here) == []


def test_the_check_catches_each_way_of_reading(tmp_path: Path) -> None:
    """A library module reading a setting in each way the rule forbids: every one is reported; the shell's
    own reads and the Docker SDK's from_env are not."""
    package = tmp_path / "trtpipe"
    (package / "commands").mkdir(parents=True)
    (package / "store").mkdir()
    (package / "store" / "probe.py").write_text(
        "import os\n"
        "from os import getenv as ge\n"
        "import docker\n"
        "from trtpipe.settings import Settings, from_env\n"
        "def home():\n"
        "    a = os.environ.get('TRTPIPE_HOME')\n"
        "    b = ge('TRTPIPE_STORE')\n"
        "    c = from_env().actor\n"
        "    d = Settings.from_env().docker\n"
        "    return docker.from_env(), a, b, c, d\n")
    (package / "commands" / "ok.py").write_text("import os\nfrom trtpipe.settings import Settings\n"
                                                "x = Settings.from_env(); y = os.environ\n")
    assert reads_below_the_cli(package, allowed={}) == [
        "store/probe.py:6: reads the environment (os.environ); take a Settings from the caller",
        "store/probe.py:7: reads the environment (os.environ); take a Settings from the caller",
        "store/probe.py:8: reads the environment (from_env); take a Settings from the caller",
        "store/probe.py:9: reads the environment (from_env); take a Settings from the caller",
    ]
    assert reads_below_the_cli(package, allowed={("store/probe.py", "os.environ"): "probe",
                                                 ("store/probe.py", "from_env"): "probe"}) == []
