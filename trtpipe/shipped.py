"""Where trtpipe's shipped data is: the one module every reader of it asks.

trtpipe reads three folders at run time:
  build_configs/  toolchains, GPU catalog, flag / rule / contract / parameter tables, LLM-API args tables,
                  model configs and example specs
  triton_repo/    the Triton templates and Python-backend models that publish copies into a repository
  data/           the release-page template and the calibration text

In the source tree, build_configs/ and triton_repo/ sit at the repository root, beside the package (the
project's documented layout; a checkout and the editable install read them there), and data/ inside it. A
wheel carries all three inside the package (trtpipe/build_configs/, trtpipe/triton_repo/, trtpipe/data/;
setup.py copies the first two in when it builds). Both places are found from the package's own location
through importlib.resources, so the answer never depends on the working directory or sys.path; the copy
inside the package wins when both exist. $TRTPIPE_BUILD_CONFIGS (read by trtpipe.settings, in the shell) overrides
build_configs/: the CLI asks `build_configs_dir(settings)` once and hands the folder down (resolve keeps it as
`ResolvedSpec.configs`); a table reader given none reads the shipped folder (`configs_dir`), never the environment.
Nothing overrides the templates (the repository key hashes them: trtpipe.serving.templates).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from trtpipe.errors import MissingCapability
from trtpipe.settings import Settings

BUILD_CONFIGS = "build_configs"
TRITON_REPO = "triton_repo"
DATA = "data"
# The folders a wheel must carry besides the code (setup.py copies these from the repository root).
ROOT_FOLDERS = (BUILD_CONFIGS, TRITON_REPO)


def package_dir() -> Path:
    """The folder the imported trtpipe package is in (site-packages/trtpipe, or a checkout's trtpipe/)."""
    root = resources.files("trtpipe")
    if not isinstance(root, Path):
        # Tritonserver, the docker executor and publish need real files: a zipped import cannot serve.
        raise MissingCapability(
            f"trtpipe is imported from {root}, which is not a folder on disk",
            fix="install trtpipe with pip (a wheel unpacks into site-packages) or from a checkout (pip install -e .)",
        )
    return root


def _root_folder(name: str) -> Path:
    """`name` inside the package (a wheel), else beside it (a checkout); the package path when neither
    exists, so a reader's own 'missing' error names where an installed trtpipe keeps it."""
    package = package_dir()
    inside, beside = package / name, package.parent / name
    if inside.is_dir() or not beside.is_dir():
        return inside
    return beside


def shipped_build_configs_dir() -> Path:
    """The build_configs/ this trtpipe ships (whatever TRTPIPE_BUILD_CONFIGS says)."""
    return _root_folder(BUILD_CONFIGS)


def build_configs_dir(settings: Settings) -> Path:
    """The build_configs/ folder the caller's settings choose: TRTPIPE_BUILD_CONFIGS if set, else the shipped one.
    (A converter child in the docker executor gets TRTPIPE_BUILD_CONFIGS set for it, and its entry reads it.)"""
    if settings.build_configs is not None:
        return settings.build_configs.resolve()
    return shipped_build_configs_dir()


def configs_dir(configs: Path | None) -> Path:
    """The build_configs/ folder a table reader reads: the one its caller chose (`build_configs_dir`), else the
    shipped one."""
    return configs if configs is not None else shipped_build_configs_dir()


def triton_repo_dir() -> Path:
    """The triton_repo/ folder (templates and Python-backend models) this trtpipe ships."""
    return _root_folder(TRITON_REPO)


def data_file(*parts: str) -> Path:
    """A file under the package's data/ folder, e.g. data_file("report", "release.html.j2")."""
    return package_dir().joinpath(DATA, *parts)


class ShippedData(BaseModel):
    """Where this trtpipe reads its data from, and how it came to be there (what `trtpipe --version` names)."""

    package: str
    build_configs: str
    build_configs_from: Literal["package", "checkout", "TRTPIPE_BUILD_CONFIGS"]
    triton_repo: str
    triton_repo_from: Literal["package", "checkout"]


def describe(settings: Settings) -> ShippedData:
    """The folders in use (as the caller's `settings` say) and their origin: the package (a wheel), a checkout,
    or the variable."""
    package = package_dir()

    def origin(path: Path) -> Literal["package", "checkout"]:
        return "package" if path.parent == package else "checkout"

    configs, templates = build_configs_dir(settings), triton_repo_dir()
    return ShippedData(
        package=str(package),
        build_configs=str(configs),
        build_configs_from="TRTPIPE_BUILD_CONFIGS" if settings.build_configs is not None else origin(configs),
        triton_repo=str(templates),
        triton_repo_from=origin(templates),
    )
