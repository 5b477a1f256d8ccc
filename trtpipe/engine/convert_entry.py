"""`python -m trtpipe.engine.convert_entry --spec SPEC --out DIR`: the checkpoint stage as a process.

Used to run the HF -> TRT-LLM checkpoint conversion (ModelOpt calibration included) on the GPU
builder, either in this environment (LocalExecutor.run_conversion) or inside the toolchain's
container (docker.conversion_container_spec), for models too large to quantize on a CPU runner.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trtpipe.engine.convert_entry")
    parser.add_argument("--spec", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)

    from trtpipe.checkpoint.convert import convert_checkpoint
    from trtpipe.errors import TrtpipeError
    from trtpipe.resolve import resolve
    from trtpipe.spec_loader import load_spec

    try:
        resolved = resolve(load_spec(args.spec))
        args.out.mkdir(parents=True, exist_ok=True)
        summary = convert_checkpoint(resolved, args.out, show_progress=True)
    except TrtpipeError as err:
        print(f"error: {err.one_line()}", file=sys.stderr)
        return err.exit_code
    print(f"[trtpipe] checkpoint written to {args.out}: {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
