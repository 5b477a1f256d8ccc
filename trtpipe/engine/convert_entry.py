"""`python -m trtpipe.engine.convert_entry --spec SPEC --out DIR [--summary FILE] [--device cuda|cpu] [--artifact hf]`

The checkpoint stage as a process: the HF -> TRT-LLM checkpoint conversion (or, with `--artifact hf`, the
llm-api backend's unified HF export; ModelOpt calibration included) run by an executor where the engine is built, on that host's GPUs: in the TensorRT-LLM
environment of a GPU host (LocalExecutor.run_conversion) or inside the toolchain's container, with
trtpipe's source mounted read-only on PYTHONPATH (DockerExecutor.run_conversion).

It imports only packages that the toolchain's TensorRT-LLM wheel brings along (see
trtpipe.engine.conversion.CONTAINER_PACKAGES), and checks that they are there before anything else.
Progress goes to stderr as plain lines; the ConvertSummary goes to --summary as JSON. A failure ends
with one line `[trtpipe-convert] error: ...` and the error's exit status (2 bad input, 3 missing
capability), which the executor turns into the stage's one-line error.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

ERROR_PREFIX = "[trtpipe-convert] error: "
# Top-level modules the conversion imports (module name -> the distribution to name when missing).
NEEDED_MODULES = {
    "pydantic": "pydantic",
    "yaml": "pyyaml",
    "rich": "rich",
    "torch": "torch",
    "safetensors": "safetensors",
    "tokenizers": "tokenizers",
    "transformers": "transformers",
    "modelopt": "nvidia-modelopt",
}
CUDA_MODULES = {"accelerate": "accelerate"}  # device_map="auto" places the model on the GPUs


def missing_modules(device: str) -> list[str]:
    """The distributions whose modules this environment lacks (found by name; nothing is imported)."""
    needed = dict(NEEDED_MODULES, **(CUDA_MODULES if device == "cuda" else {}))
    return [dist for module, dist in needed.items() if importlib.util.find_spec(module) is None]


def _fail(message: str, exit_code: int) -> int:
    print(f"{ERROR_PREFIX}{message}", file=sys.stderr, flush=True)
    return exit_code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trtpipe.engine.convert_entry")
    parser.add_argument("--spec", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--summary", type=Path, default=None, help="write the ConvertSummary here as JSON")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--artifact", choices=("trtllm", "hf"), default="trtllm",
                        help="trtllm: a TRT-LLM checkpoint; hf: the llm-api backend's unified HF export")
    args = parser.parse_args(argv)

    missing = missing_modules(args.device)
    if missing:
        return _fail(
            f"this Python environment ({sys.executable}) lacks {', '.join(missing)}, which the conversion "
            "imports; run it in the toolchain's TensorRT-LLM container or environment",
            3,
        )

    import trtpipe
    from trtpipe.checkpoint.convert import convert_checkpoint
    from trtpipe.errors import InvalidInput, TrtpipeError
    from trtpipe.resolve import resolve
    from trtpipe.settings import Settings
    from trtpipe.shipped import build_configs_dir, package_dir
    from trtpipe.spec_loader import load_spec
    from trtpipe.versions import installed_version

    # Which code and which packages convert: the first thing to read in a log from another host.
    versions = ", ".join(f"{name} {installed_version(name) or 'not installed'}"
                         for name in ("nvidia-modelopt", "transformers", "torch"))
    print(f"[trtpipe] converting on {args.device} with trtpipe {trtpipe.__version__} from "
          f"{package_dir()}, {versions}", file=sys.stderr, flush=True)
    try:
        # A process entry, as the CLI is: the executor sets TRTPIPE_BUILD_CONFIGS to the tables the build resolved
        # the spec with (the docker executor to their mount), and this child reads its own environment once.
        resolved = resolve(load_spec(args.spec), configs=build_configs_dir(Settings.from_env()))
        if not args.out.is_dir():
            raise InvalidInput(f"{args.out}: the output directory does not exist", fix="create it first")
        if args.artifact == "hf":
            from trtpipe.checkpoint.hf_export import export_hf_artifact

            summary = export_hf_artifact(resolved, args.out, show_progress=True, progress_lines=True,
                                         device=args.device)
        else:
            summary = convert_checkpoint(resolved, args.out, show_progress=True, progress_lines=True,
                                         device=args.device)
    except TrtpipeError as err:
        return _fail(err.one_line(), err.exit_code)
    if args.summary is not None:
        staging = args.summary.with_name(f".{args.summary.name}.tmp")
        staging.write_text(summary.model_dump_json(indent=2) + "\n", encoding="utf-8")
        os.replace(staging, args.summary)
    print(f"[trtpipe] checkpoint written to {args.out}: {summary.total_bytes} bytes in {len(summary.files)} files, "
          f"{summary.seconds:.1f}s", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
