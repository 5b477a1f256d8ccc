"""The `trtpipe` command line: thin by design. Each command parses, calls one function, prints.

Commands live in `trtpipe/commands/<area>.py`, each exposing `register(app)`.
"""

from __future__ import annotations

import sys

import typer

from trtpipe.commands import build as build_commands
from trtpipe.commands import bench as bench_commands
from trtpipe.commands import checkpoint as checkpoint_commands
from trtpipe.commands import engine as engine_commands
from trtpipe.commands import foundation as foundation_commands
from trtpipe.commands import release as release_commands
from trtpipe.commands import serving as serving_commands
from trtpipe.commands import store as store_commands
from trtpipe.errors import TrtpipeError

AREAS = (
    foundation_commands,
    checkpoint_commands,
    store_commands,
    build_commands,
    engine_commands,
    serving_commands,
    bench_commands,
    release_commands,
)


def make_app() -> typer.Typer:
    app = typer.Typer(
        name="trtpipe",
        help="Hugging Face checkpoint -> TensorRT-LLM engine -> Triton deployment, reproducibly.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        add_completion=False,
    )
    for area in AREAS:
        area.register(app)
    return app


def main(argv: list[str] | None = None) -> int:
    app = make_app()
    try:
        # standalone_mode=False: click returns typer.Exit codes instead of calling sys.exit.
        result = app(args=argv, standalone_mode=False)
    except TrtpipeError as err:
        print(f"error: {err.one_line()}", file=sys.stderr)
        return err.exit_code
    except OSError as err:
        # The filesystem said no (permission, read-only, no space, not a directory): name the path.
        where = f"{err.filename}: " if err.filename else ""
        print(f"error: {where}{err.strerror or err}; check the path and its permissions", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except SystemExit as exc:  # an explicit sys.exit somewhere below
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    except typer.Abort:
        print("error: aborted", file=sys.stderr)
        return 130
    except Exception as exc:
        # Usage errors (missing argument, bad option value): typer raises its click exception
        # types (vendored inside typer since 0.29), which all carry `show()` and `exit_code`.
        show = getattr(exc, "show", None)
        exit_code = getattr(exc, "exit_code", None)
        if callable(show) and isinstance(exit_code, int):
            show()
            return exit_code
        raise
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
