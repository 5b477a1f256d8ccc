"""`trtpipe --version`: the renderer of `trtpipe.installation.Installation` (the root callback in cli.py calls it)."""

from __future__ import annotations

import typer

from trtpipe.commands.output import print_table
from trtpipe.installation import Installation

ORIGINS = {"package": "shipped inside the package", "checkout": "the checkout, beside the package",
           "TRTPIPE_BUILD_CONFIGS": "$TRTPIPE_BUILD_CONFIGS"}


def print_installation(info: Installation, *, as_json: bool) -> None:
    """The first line is always "trtpipe" and the version (scripts read it); then the pinned toolchains and where the
    data comes from. A problem is the one error line on stderr, after what could be said."""
    if as_json:
        typer.echo(info.model_dump_json(indent=2))
    else:
        typer.echo(f"trtpipe {info.trtpipe}")
        if info.toolchains is not None:
            print_table(None, ["toolchain", "TensorRT-LLM", "backends", "note"],
                        [[t.name, t.trtllm_version, ", ".join(t.backends), "preview" if t.preview else ""]
                         for t in info.toolchains])
        if info.data is not None:
            typer.echo(f"python {info.python}, package {info.data.package}")
            typer.echo(f"build_configs {info.data.build_configs} ({ORIGINS[info.data.build_configs_from]})")
            typer.echo(f"triton_repo   {info.data.triton_repo} ({ORIGINS[info.data.triton_repo_from]})")
    if info.problem is not None:
        typer.echo(f"error: {info.problem.error}", err=True)
