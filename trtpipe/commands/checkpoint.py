"""CLI commands for the checkpoint area: `example-model` and `convert`. Thin: parse, call one function, print."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Optional

import typer

from trtpipe.commands.output import JsonOption, command_configs, json_option, print_table
from trtpipe.errors import UsageError

EXAMPLE_HELP = (
    "Write a tiny, deterministic, briefly trained Hugging Face model (safetensors + byte-level BPE tokenizer) "
    "to DIR, for trying trtpipe without downloading anything. Same bytes on every run."
)
CONVERT_HELP = (
    "Convert the spec's Hugging Face model to a TensorRT-LLM checkpoint (config.json + rank{N}.safetensors) "
    "with NVIDIA ModelOpt at the toolchain's pinned version: quantize, calibrate, export, validate. "
    "Without --out it writes out/checkpoints/<name>-<algo>[-kv<kv>]-tp<T>-pp<P> under the current folder. "
    "The folder appears only when complete (written beside it, then renamed)."
)


def default_checkpoint_dir(spec: object) -> Path:
    """out/checkpoints/<name>-<algo>[-kvfp8]-tp<T>-pp<P>, relative to the current folder."""
    quant = spec.quantization  # type: ignore[attr-defined]
    target = spec.target  # type: ignore[attr-defined]
    kv = f"-kv{quant.kv_cache}" if quant.kv_cache != "auto" else ""
    name = f"{spec.artifact_name}-{quant.algo}{kv}-tp{target.tp}-pp{target.pp}"  # type: ignore[attr-defined]
    return Path("out") / "checkpoints" / name


def _refuse_occupied(out: Path, force: bool) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not force:
        raise UsageError(f"{out} exists and is not empty", fix="choose another --out or pass --force to replace it")


def _replace_dir(staging: Path, out: Path) -> None:
    """Put the finished `staging` at `out`, removing what --force allowed us to replace."""
    if out.exists():
        graveyard = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        os.replace(out, graveyard / out.name)
        shutil.rmtree(graveyard, ignore_errors=True)
    os.rename(staging, out)


def example_model_command(
    directory: Path = typer.Argument(..., help="Folder to create (must not exist or be empty)."),
    arch: str = typer.Option("llama", "--arch", help="llama, qwen2 (QKV bias) or mistral."),
    tied: bool = typer.Option(False, "--tied", help="Tie the output head to the input embedding (tie_word_embeddings, "
                              "like Qwen2.5 0.5-3B and Llama 3.2 1B/3B)."),
    sliding_window: Optional[int] = typer.Option(None, "--sliding-window", help="mistral: an attention window of N "
                                                 "tokens (what a conversion must keep although no tensor holds it)."),
    vocab_size: int = typer.Option(512, "--vocab-size", help="The tokenizer's ids (not a multiple of 64: INT4-AWQ "
                                   "pads the checkpoint's vocabulary)."),
    head_dim: int = typer.Option(64, "--head-dim", help="Per-head width (llama, mistral; 64 = hidden / heads)."),
    kv_heads: int = typer.Option(2, "--kv-heads", help="KV heads of the 4 attention heads (4: multi-head attention)."),
    force: bool = typer.Option(False, "--force", help="Replace DIR if it is not empty."),
    as_json: JsonOption = False,
) -> None:
    from pydantic import ValidationError

    from trtpipe.checkpoint.example_model import Variant, write_example_model

    try:
        variant = Variant(sliding_window=sliding_window, vocab_size=vocab_size, head_dim=head_dim,
                          num_kv_heads=kv_heads)
    except ValidationError as err:
        first = err.errors()[0]
        flag = {"sliding_window": "--sliding-window", "vocab_size": "--vocab-size", "head_dim": "--head-dim",
                "num_kv_heads": "--kv-heads"}.get(str(first["loc"][0]), str(first["loc"][0]))
        raise UsageError(f"{flag}: {first['msg']}", fix=f"give {flag} a value in its range (see --help)") from None
    path = write_example_model(directory, arch=arch, tied=tied, overwrite=force, variant=variant)
    files = [
        {"name": p.name, "bytes": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
        for p in sorted(path.iterdir())
    ]
    if as_json:
        print(json.dumps({"path": str(path), "arch": arch, "tied": tied, "files": files}, indent=2))
        return
    print_table(f"wrote {arch}{' (tied head)' if tied else ''} example model to {path}", ["file", "bytes", "sha256"],
                [[f["name"], f"{f['bytes']:,}", f["sha256"]] for f in files])


def convert_command(
    spec_path: Path = typer.Argument(..., metavar="SPEC", help="Build spec (YAML)."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Checkpoint folder to create."),
    force: bool = typer.Option(False, "--force", help="Replace --out if it is not empty."),
    as_json: Annotated[bool, json_option("Print the summary as JSON on stdout (files, bytes, time, memory, digests); "
                                         "a refusal is a JSON object there too.")] = False,
) -> None:
    from trtpipe.checkpoint.convert import convert_checkpoint
    from trtpipe.resolve import resolve
    from trtpipe.spec_loader import load_spec

    resolved = resolve(load_spec(spec_path), configs=command_configs())
    out = out if out is not None else default_checkpoint_dir(resolved.spec)
    _refuse_occupied(out, force)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        summary = convert_checkpoint(resolved, staging, show_progress=sys.stderr.isatty())
        _refuse_occupied(out, force)  # someone may have filled it while we converted
        _replace_dir(staging, out)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    summary = summary.model_copy(update={"out_dir": str(out)})
    if as_json:
        print(summary.model_dump_json(indent=2))
        return
    print_table(f"checkpoint {out}", ["file", "bytes", "sha256"], [[f.name, f"{f.bytes:,}", f.sha256] for f in summary.files])
    kv = f", KV {summary.kv_cache_quant_algo}" if summary.kv_cache_quant_algo else ""
    typer.echo(
        f"{summary.architecture} {summary.dtype}, {summary.quant_algo or 'unquantized'}{kv}, "
        f"tp={summary.tp} pp={summary.pp}: {summary.total_bytes / 1e6:.1f} MB in {summary.seconds:.1f} s, "
        f"peak RSS {summary.peak_rss_bytes / 2**30:.2f} GiB"
    )
    for note in summary.notes:
        typer.echo(f"note: {note}")


def register(app: typer.Typer) -> None:
    """Add this area's commands to the trtpipe app."""
    app.command("example-model", help=EXAMPLE_HELP, rich_help_panel="Build")(example_model_command)
    app.command("convert", help=CONVERT_HELP, rich_help_panel="Build")(convert_command)
