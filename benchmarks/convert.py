"""Benchmark of the checkpoint stage: a synthetic Llama-shaped model converted to FP16, FP8 and INT4-AWQ.

    python benchmarks/convert.py                      # ~1B parameters (TinyLlama-like shape)
    python benchmarks/convert.py --params 5e7         # a quick run
    python benchmarks/convert.py --formats none,fp8   # a subset

Each format converts in its own child process, so the peak RSS (VmHWM of that process, which includes
the torch/ModelOpt imports, reported separately as rss_after_imports_bytes) belongs to that format alone. Prints one JSON document: per format the
wall time, checkpoint bytes, model bytes per second, and peak RSS as a multiple of the model's bytes.
No thresholds: this is the baseline.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VOCAB = 32000


def shape_for(params: float) -> dict[str, int]:
    """A Llama-like shape of about `params` parameters (hidden and intermediate multiples of 128)."""
    hidden = 2048 if params >= 5e8 else 1024 if params >= 1e8 else 512 if params >= 2e7 else 256
    head_dim = 128 if hidden >= 512 else 64
    heads = hidden // head_dim
    kv_heads = max(1, heads // 4)
    intermediate = -(-int(hidden * 2.75) // 128) * 128
    per_layer = 2 * hidden * hidden + 2 * hidden * kv_heads * head_dim + 3 * hidden * intermediate
    layers = max(1, round((params - 2 * VOCAB * hidden) / per_layer))
    return {
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "num_hidden_layers": layers,
        "vocab_size": VOCAB,
    }


def write_synthetic_model(out: Path, params: float) -> dict[str, int]:
    """Random-weight bf16 Llama of the chosen size, with the example model's tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from trtpipe.checkpoint.example_model import BOS_TOKEN, EOS_TOKEN, PAD_TOKEN, shipped_paragraphs, train_tokenizer

    shape = shape_for(params)
    config = LlamaConfig(
        **shape, max_position_embeddings=4096, tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, pad_token_id=2
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.save_pretrained(out, safe_serialization=True)
    PreTrainedTokenizerFast(
        tokenizer_object=train_tokenizer(shipped_paragraphs()), bos_token=BOS_TOKEN, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN
    ).save_pretrained(out)
    shape["params"] = sum(p.numel() for p in model.parameters())
    return shape


def peak_rss_bytes() -> int:
    """VmHWM of this process: its own peak. (ru_maxrss is inherited across fork and kept across exec, so a
    child would report the parent's peak.)"""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # not Linux: best effort


def child(model: Path, out: Path, algo: str, samples: int, seq_len: int) -> None:
    """Runs in its own process: one conversion, then its figures as JSON on stdout."""
    import modelopt.torch.export  # noqa: F401  (imports are not conversion time)
    import modelopt.torch.quantization  # noqa: F401

    from trtpipe.checkpoint.recipes import convert_local

    rss_after_imports = peak_rss_bytes()
    started = time.monotonic()
    summary = convert_local(model, out, algo=algo, samples=samples, max_seq_len=seq_len, dtype="float16")
    seconds = time.monotonic() - started
    print(
        json.dumps(
            {
                "seconds": round(seconds, 2),
                "checkpoint_bytes": summary.total_bytes,
                "quant_algo": summary.quant_algo,
                "peak_rss_bytes": peak_rss_bytes(),
                "rss_after_imports_bytes": rss_after_imports,
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", type=float, default=1e9, help="model size in parameters (default 1e9)")
    parser.add_argument("--formats", default="none,fp8,int4_awq", help="comma-separated spec algos")
    parser.add_argument("--samples", type=int, default=8, help="calibration windows")
    parser.add_argument("--seq-len", type=int, default=128, help="calibration window length in tokens")
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temp dir)")
    parser.add_argument("--child", nargs=3, metavar=("MODEL", "OUT", "ALGO"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(Path(args.child[0]), Path(args.child[1]), args.child[2], args.samples, args.seq_len)
        return

    with tempfile.TemporaryDirectory(dir=args.work) as scratch:
        work = Path(scratch)
        started = time.monotonic()
        shape = write_synthetic_model(work / "model", args.params)
        model_bytes = sum(p.stat().st_size for p in (work / "model").glob("*.safetensors"))
        results = {
            "benchmark": "convert",
            "host": {"machine": platform.machine(), "cpus": _cpus(), "python": platform.python_version()},
            "model": {**shape, "bytes": model_bytes, "dtype": "bfloat16", "write_seconds": round(time.monotonic() - started, 2)},
            "calibration": {"samples": args.samples, "max_seq_len": args.seq_len},
            "export_dtype": "float16",
            "formats": {},
        }
        for algo in args.formats.split(","):
            proc = subprocess.run(
                [sys.executable, __file__, "--samples", str(args.samples), "--seq-len", str(args.seq_len),
                 "--child", str(work / "model"), str(work / f"ckpt-{algo}"), algo],
                capture_output=True,
                text=True,
            )
            if proc.returncode != 0:
                results["formats"][algo] = {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1]}
                continue
            figures = json.loads(proc.stdout.strip().splitlines()[-1])
            figures["model_bytes_per_second"] = round(model_bytes / figures["seconds"])
            figures["peak_rss_over_model_bytes"] = round(figures["peak_rss_bytes"] / model_bytes, 2)
            above_imports = figures["peak_rss_bytes"] - figures["rss_after_imports_bytes"]
            figures["peak_rss_above_imports_over_model_bytes"] = round(above_imports / model_bytes, 2)
            results["formats"][algo] = figures
        print(json.dumps(results, indent=2))


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


if __name__ == "__main__":
    main()
