"""The one build step pyproject.toml cannot declare: the wheel carries build_configs/ and triton_repo/.

Both folders sit at the repository root (the documented layout; a checkout and the editable install read them
there). setuptools' package data must live inside a package folder, so this copies them into the built package
as trtpipe/build_configs/ and trtpipe/triton_repo/, where trtpipe.shipped finds them in an installed wheel.
An editable build copies nothing: it reads the repository's folders in place. Everything else is in
pyproject.toml; MANIFEST.in puts both folders into the sdist, so a wheel built from the sdist has them too.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

# The same names as trtpipe.shipped.ROOT_FOLDERS (setup.py cannot import the package it builds).
ROOT_FOLDERS = ("build_configs", "triton_repo")
NOT_SHIPPED = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo")


class BuildPyWithRootFolders(build_py):
    """build_py, then the root folders copied into the built package."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        for name in ROOT_FOLDERS:
            source = Path(name)  # setuptools runs this with the project root as the working directory
            if not source.is_dir():
                raise SystemExit(f"setup.py: {source.resolve()} is missing; build from a checkout or the sdist")
            target = Path(self.build_lib) / "trtpipe" / name
            shutil.rmtree(target, ignore_errors=True)  # a stale build/ folder must not leak removed files
            shutil.copytree(source, target, ignore=NOT_SHIPPED)


setup(cmdclass={"build_py": BuildPyWithRootFolders})
