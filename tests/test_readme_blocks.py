"""Issue 23: the README's command blocks run in the order a reader meets them.

As found: the matrix section began with `trtpipe example-model out/tiny-llama && trtpipe example-model
out/tiny-qwen2 --arch qwen2`; a reader who had followed the README from the top had written out/tiny-llama
already, so the first command exited 2 (the folder exists) and the qwen2 model was never written.

Here every README line that writes an example model is run, in reading order (the README, then the docs pages
its "Read on" table links, in that order), in one scratch folder, with
the installed `trtpipe`: each must exit 0, and every model the README's matrix file reads must exist after.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_MODEL = re.compile(r"trtpipe example-model (\S+)")


LINKED_PAGE = re.compile(r"^\| \[(docs/[\w-]+\.md)\]", re.M)


def reading_order() -> str:
    """The README, then each page its "Read on" table links, in that order: how a reader meets the commands."""
    readme = (ROOT / "README.md").read_text()
    pages = LINKED_PAGE.findall(readme)
    return "\n".join([readme, *((ROOT / page).read_text() for page in pages)])


def test_the_readme_is_a_front_door_and_every_page_it_links_exists() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    pages = LINKED_PAGE.findall(readme)
    assert len(pages) >= 8 and all((ROOT / page).is_file() for page in pages), pages
    # Every page in docs/ is reachable from the README.
    assert {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")} <= set(pages)


def _bash_lines(text: str) -> list[str]:
    """Every line of the README's ```bash blocks, in order."""
    lines, inside = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            inside = line.strip() == "```bash" if not inside else False
            continue
        if inside:
            lines.append(line)
    return lines


def test_example_model_refuses_a_folder_that_exists(tmp_path: Path) -> None:
    """Why the README must guard: the command itself never overwrites."""
    from trtpipe.cli import main

    assert main(["example-model", str(tmp_path / "m")]) == 0
    assert main(["example-model", str(tmp_path / "m")]) == 2


@pytest.mark.timeout(300)
def test_every_readme_line_that_writes_an_example_model_runs_in_order(tmp_path: Path) -> None:
    lines = [line for line in _bash_lines(reading_order()) if EXAMPLE_MODEL.search(line)]
    assert len(lines) >= 4, lines  # check-a-host, the flow, and the matrix section's two models
    trtpipe = shutil.which("trtpipe", path=str(Path(sys.executable).parent))
    assert trtpipe is not None
    env = {**os.environ, "PATH": f"{Path(trtpipe).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    for line in lines:
        command = line.split("  #")[0].strip()
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, (command, done.stderr)
    # What the matrix file (and the cpu examples) read: every model folder it names was written.
    matrix = (ROOT / "build_configs" / "examples" / "matrices" / "tiny.yaml").read_text()
    for folder in re.findall(r"path: \.\./\.\./\.\./(out/[\w-]+)", matrix):
        assert (tmp_path / folder / "config.json").is_file(), folder
