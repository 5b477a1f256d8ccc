"""Benchmark of `trtpipe serve`'s serving directory: O(1) in engine size. Prints one JSON object.

For a tiny engine file and a large one (default 1 GiB), each a real repository entry in a fresh store:
- `prepare_cold_s`: the first serving directory of the entry (verification hashes every file once:
  O(size), like any first read; the digest cache remembers the result);
- `prepare_warm_s` / `remove_s`: median of the following ones (verification through the digest cache,
  hard links for the engine, copies of the small files): what every later `serve` pays;
- `copy_baseline_s`: the same repository copied with shutil.copytree, in the same run (what serving
  from a copy would cost each time).
`warm_ratio_large_vs_tiny` near 1 is the O(1) claim; `copy_ratio_large_vs_tiny` shows the O(n) it avoids.

Usage: .venv/bin/python benchmarks/serving_dir.py [--size-gb 1.0] [--repeats 5] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CHUNK = 64 * 1024 * 1024


def _entry(store, key: str, engine_bytes: int):
    """A repository entry shaped like a published one, with an engine file of `engine_bytes`."""
    with store.building("repository", key) as b:
        engine = b.dir / "tensorrt_llm" / "1"
        engine.mkdir(parents=True)
        with open(engine / "rank0.engine", "wb") as out:
            left = engine_bytes
            while left > 0:
                block = os.urandom(min(CHUNK, left))
                out.write(block)
                left -= len(block)
        (engine / "config.json").write_text(json.dumps({"version": "1.2.1"}))
        for model in ("ensemble", "preprocessing", "tensorrt_llm", "postprocessing", "tensorrt_llm_bls"):
            (b.dir / model).mkdir(exist_ok=True)
            (b.dir / model / "config.pbtxt").write_text(f'name: "{model}"\nbackend: "python"\n')
        (b.dir / "preprocessing" / "1").mkdir()
        (b.dir / "preprocessing" / "1" / "model.py").write_text("# model\n" * 200)
        (b.dir / "trtpipe.json").write_text(json.dumps({"engine": {"files": ["config.json", "rank0.engine"]}}))
        return b.commit(inputs={"bench": key})


def _measure(entry, repeats: int) -> dict:
    from trtpipe.serving.serving_copy import prepare

    started = time.perf_counter()
    first = prepare(entry.path)
    cold = time.perf_counter() - started
    assert first.linked == ["tensorrt_llm/1/rank0.engine"], first.linked
    first.remove()
    warm, removal = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        serving = prepare(entry.path)
        warm.append(time.perf_counter() - started)
        started = time.perf_counter()
        serving.remove()
        removal.append(time.perf_counter() - started)
    copy_dir = entry.path.parent.parent / "copy-baseline"
    started = time.perf_counter()
    shutil.copytree(entry.path, copy_dir)
    copied = time.perf_counter() - started
    shutil.rmtree(copy_dir)
    return {
        "engine_bytes": entry.size,
        "prepare_cold_s": round(cold, 6),
        "prepare_warm_s": round(statistics.median(warm), 6),
        "prepare_warm_max_s": round(max(warm), 6),
        "remove_s": round(statistics.median(removal), 6),
        "copy_baseline_s": round(copied, 6),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    from trtpipe.store.local import Store

    work = Path(tempfile.mkdtemp(prefix="trtpipe-bench-serving-", dir=args.workdir))
    try:
        results = {}
        for label, size in (("tiny", 4096), ("large", int(args.size_gb * 2**30))):
            store = Store.open(work / label / "home")
            entry = _entry(store, f"bench-{label}", size)
            time.sleep(2.1)  # past the digest cache's racy window, as a stored entry is when it is served
            results[label] = _measure(entry, args.repeats)
        tiny, large = results["tiny"], results["large"]
        print(json.dumps({
            "benchmark": "serving_dir",
            "size_gb": args.size_gb,
            "repeats": args.repeats,
            **results,
            "warm_ratio_large_vs_tiny": round(large["prepare_warm_s"] / tiny["prepare_warm_s"], 2),
            "copy_ratio_large_vs_tiny": round(large["copy_baseline_s"] / tiny["copy_baseline_s"], 2),
        }, indent=2))
    finally:
        from trtpipe.store.readonly import remove_tree

        remove_tree(work)


if __name__ == "__main__":
    main()
