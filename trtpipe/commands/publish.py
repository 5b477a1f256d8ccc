"""`trtpipe publish SPEC --engine DIR`: a Triton repository for an engine built outside trtpipe. Thin: options ->
a request (trtpipe.pipeline.PublishRequest) -> one library call (run_publish) -> its outcome -> one output."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from trtpipe.commands.output import JsonOption, StoreOption, open_workspace


def register(app: typer.Typer) -> None:
    """Add this area's commands to the trtpipe app."""

    @app.command("publish", rich_help_panel="Build")
    def publish(
        spec: Annotated[Path, typer.Argument(help="Build spec YAML the engine was built for (a planning-only spec "
                                                  "with model.config is enough: nothing is converted).")],
        engine: Annotated[Path, typer.Option("--engine", help="The engine folder trtllm-build wrote (config.json and "
                                                              "rank{N}.engine), built outside trtpipe.")],
        tokenizer: Annotated[Optional[Path], typer.Option(
            "--tokenizer", help="Tokenizer folder (tokenizer.json) for the repository's models (default: the spec's "
                                "model.tokenizer or model folder, else tokenizer files in the engine folder).")] = None,
        json_out: JsonOption = False,
        store: StoreOption = None,
    ) -> None:
        """Check an engine built outside trtpipe against the spec (TensorRT-LLM version, GPU, limits, tp/pp, in-flight
        batching essentials, rank files), store it and publish its Triton repository, as `build` publishes."""
        from trtpipe.pipeline import PublishRequest, run_publish

        from trtpipe.store.remote import remote_use

        request = PublishRequest(spec=spec, engine=engine, tokenizer=tokenizer)
        workspace = open_workspace(store)
        use = remote_use(workspace.settings)  # TRTPIPE_REMOTE_MODE, TRTPIPE_REQUIRE_REMOTE: as for build
        try:
            # A refusal goes the one way every command's does (cli.refuse): with --json its JSON object on
            # stdout, every problem of an outside engine among its verdicts.
            outcome = run_publish(request, store=workspace.store, remote=workspace.remote, progress=not json_out,
                                  remote_use=use, settings=workspace.settings)
        finally:
            workspace.close()
        if json_out:
            typer.echo(outcome.model_dump_json(indent=2))
            return
        for note in outcome.notes:
            typer.echo(f"note: {note}", err=True)
        typer.echo(f"published {outcome.name} for {outcome.target} from {outcome.imported_from} in "
                   f"{outcome.seconds:.2f}s", err=True)
        typer.echo(f"repository: {outcome.repository_path}")
        typer.echo(f"engine: {outcome.engine_digest}")
        typer.echo(f"repository digest: {outcome.repository_digest}")
