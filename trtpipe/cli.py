"""The `trtpipe` command line: thin by design. Each command parses, builds its workspace, calls one
function, prints.

Commands live in `trtpipe/commands/<area>.py`, each exposing `register(app)`, and import what they
run inside the command, so `trtpipe --help` and a warm build import only what they need.
Errors: a `TrtpipeError` prints as one line, `error: <what>; <fix>[; <hint>]` (the hint from
`trtpipe.commands.hints`), and exits with its code (`trtpipe.errors.EXIT_CODES`, the table in docs/cli.md).
"""

from __future__ import annotations

import sys

import typer

from trtpipe.commands import bench as bench_commands
from trtpipe.commands import build as build_commands
from trtpipe.commands import checkpoint as checkpoint_commands
from trtpipe.commands import engine as engine_commands
from trtpipe.commands import foundation as foundation_commands
from trtpipe.commands import matrix as matrix_commands
from trtpipe.commands import publish as publish_commands
from trtpipe.commands import release as release_commands
from trtpipe.commands import report as report_commands
from trtpipe.commands import serving as serving_commands
from trtpipe.commands import store as store_commands
from trtpipe.commands.output import CommandOutput, print_refusal
from trtpipe.errors import Interrupted, TrtpipeError, UsageError

# Registration order is help order within a panel; panels appear in order of first use.
AREAS = (
    foundation_commands,  # Plan
    checkpoint_commands,  # Build
    build_commands,
    publish_commands,
    matrix_commands,
    engine_commands,
    serving_commands,  # Serve
    bench_commands,
    release_commands,  # Release
    report_commands,
    store_commands,  # Store
)


def make_app() -> typer.Typer:
    app = typer.Typer(
        name="trtpipe",
        help="Hugging Face checkpoint -> TensorRT-LLM engine -> Triton deployment, reproducibly.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        add_completion=False,
    )

    # invoke_without_command: `trtpipe --version [--json]` runs the root alone (an eager --version could not see
    # a --json that follows it); no_args_is_help still answers a bare `trtpipe`.
    @app.callback(invoke_without_command=True)
    def _root(
        version: bool = typer.Option(
            False, "--version", help="Print trtpipe's version, the pinned toolchains (TensorRT-LLM versions) and "
                                     "where its data is read from, and exit."
        ),
        as_json: bool = typer.Option(False, "--json", help="With --version: print it as JSON on stdout."),
    ) -> None:
        """Hugging Face checkpoint -> TensorRT-LLM engine -> Triton deployment, reproducibly."""
        if version:
            from trtpipe.commands.version import print_installation
            from trtpipe.installation import describe_installation
            from trtpipe.settings import Settings

            info = describe_installation(Settings.from_env())
            print_installation(info, as_json=as_json)
            raise typer.Exit(info.problem.exit_code if info.problem is not None else 0)
        if as_json:
            # `trtpipe --json build ...` would otherwise drop the flag silently: each command has its own.
            raise UsageError("--json before a command is only for --version",
                             fix="put --json after the command's name, e.g. trtpipe check --json")

    for area in AREAS:
        area.register(app)
    return app


def error_line(err: TrtpipeError) -> str:
    """What the CLI prints for an error: one line, with the command hint its type and fields call for."""
    from trtpipe.commands.hints import hint_for

    return _line(err, hint_for(err))


def _line(err: TrtpipeError, hint: str | None) -> str:
    line = err.one_line() if isinstance(err, Interrupted) else f"error: {err.one_line()}"
    return f"{line}; {hint}" if hint else line


def refuse(err: TrtpipeError, output: CommandOutput | None) -> int:
    """Report a refusal the one way every command does (its line on stderr; with --json a JSON object on
    stdout too: trtpipe.commands.output.print_refusal) and return its exit code."""
    from trtpipe.commands.hints import hint_for

    hint = hint_for(err)
    print_refusal(err, _line(err, hint), hint, output)
    return err.exit_code


INTERRUPTED = "interrupted: nothing half-written (every write is to a temporary place, then renamed)"
EXIT_INTERRUPTED = 130


def main(argv: list[str] | None = None) -> int:
    app = make_app()
    output = CommandOutput()  # the command's --json sets it (trtpipe.commands.output.json_option)
    try:
        # standalone_mode=False: click returns typer.Exit codes instead of calling sys.exit.
        result = app(args=argv, standalone_mode=False, obj=output)
    except TrtpipeError as err:
        return refuse(err, output)
    except OSError as err:
        # The filesystem said no (permission, read-only, no space, not a directory): name the path.
        from trtpipe.disk import disk_full, disk_full_error

        if disk_full(err):
            return refuse(disk_full_error(err, err.filename), output)
        where = f"{err.filename}: " if err.filename else ""
        return refuse(TrtpipeError(f"{where}{err.strerror or err}", fix="check the path and its permissions"), output)
    except KeyboardInterrupt:
        print(INTERRUPTED, file=sys.stderr)
        return EXIT_INTERRUPTED
    except SystemExit as exc:  # an explicit sys.exit somewhere below
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    except typer.Abort:
        print(INTERRUPTED, file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:
        from trtpipe.disk import disk_full, disk_full_error

        if disk_full(exc):  # SQLite's "database or disk is full", safetensors' "os error 28", outside a build
            return refuse(disk_full_error(exc, None), output)
        # Usage errors (missing argument, bad option value): typer raises its click exception
        # types (vendored inside typer since 0.29), which all carry `show()` and `exit_code`.
        show = getattr(exc, "show", None)
        exit_code = getattr(exc, "exit_code", None)
        if callable(show) and isinstance(exit_code, int):
            show()
            return exit_code
        raise
    if result == EXIT_INTERRUPTED:
        # typer turns a KeyboardInterrupt inside a command into a silent exit 130 (no command returns 130
        # itself; `build` catches its own Ctrl-C to say what it stored): say what happened.
        print(INTERRUPTED, file=sys.stderr)
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
