"""What this trtpipe installation is: its version, where it reads its data from, and the toolchains it pins
(what `trtpipe --version` prints).

The version is written once, as `trtpipe.__version__`; pyproject.toml reads it from there, so the installed
distribution's metadata (importlib.metadata) says the same. A broken installation still tells its version:
the table's error is part of the answer, not instead of it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pydantic import BaseModel

from trtpipe.errors import TrtpipeError
from trtpipe.settings import Settings
from trtpipe.shipped import ShippedData, describe
from trtpipe.toolchain import load_toolchains


class PinnedToolchain(BaseModel):
    """One line of build_configs/toolchains.yaml, as far as a version report needs it."""

    name: str
    trtllm_version: str
    backends: list[str]
    preview: bool


class InstallationProblem(BaseModel):
    """Why part of the report is missing: the one-line error and its exit code."""

    error: str
    exit_code: int


class Installation(BaseModel):
    ok: bool
    trtpipe: str
    python: str
    data: ShippedData | None
    toolchains: list[PinnedToolchain] | None
    problem: InstallationProblem | None = None


def describe_installation(settings: Settings) -> Installation:
    """This trtpipe's version, data folders (as the caller's `settings` say) and pinned toolchains (stable and
    preview, oldest first)."""
    import trtpipe

    python = ".".join(str(part) for part in sys.version_info[:3])
    data: ShippedData | None = None
    try:
        data = describe(settings)
        pinned = load_toolchains(Path(data.build_configs) / "toolchains.yaml", include_preview=True).values()
    except TrtpipeError as err:
        problem = InstallationProblem(error=err.one_line(), exit_code=err.exit_code)
        return Installation(ok=False, trtpipe=trtpipe.__version__, python=python, data=data, toolchains=None,
                            problem=problem)
    toolchains = [PinnedToolchain(name=t.name, trtllm_version=t.trtllm_version, backends=[b.kind for b in t.backends],
                                  preview=t.preview is not None) for t in pinned]
    return Installation(ok=True, trtpipe=trtpipe.__version__, python=python, data=data, toolchains=toolchains)
