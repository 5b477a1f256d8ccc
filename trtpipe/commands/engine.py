"""CLI commands for the engine area. Thin: parse, call one function, print."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this area's commands to the trtpipe app."""
