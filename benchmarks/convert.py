"""Benchmark of the checkpoint stage: memory, time and bytes read, trtpipe against a bare ModelOpt script.

    python benchmarks/convert.py                                  # tiny + big (4 layers, ~2.3 GB), none/fp8/int4_awq
    python benchmarks/convert.py --models big --formats none,fp8  # a subset
    python benchmarks/convert.py --big-layers 6 --awq-samples 2   # a larger model; a cheaper INT4-AWQ calibration

Models:
  tiny  the example model (trtpipe example-model: a trained 2-layer Llama, 2.9 MB);
  big   a Llama of 8B width (hidden 4096, intermediate 14336, 32 heads, 8 KV heads, vocab 32000) with
        --big-layers layers of random bf16 weights (std 0.02, norms 1), written tensor by tensor as safetensors.

Per model and format, three conversions, each in its own child process (so a peak belongs to one conversion):
  bare      a bare ModelOpt script: from_pretrained in bfloat16, mtq.quantize (calibrated formats),
            export_tensorrt_llm_checkpoint (float16) - what the issue's "today" figures measured;
  modelopt  trtpipe with quantization.converter: modelopt (the whole model in ModelOpt, as before issue 15);
  auto      trtpipe's automatic choice: streaming (none) or layer-wise calibration (fp8, int4_awq).
Figures per conversion: seconds (after imports), peak RSS (VmHWM of the child: everything, imports included)
and its ratio to the model's bytes, the RSS after imports, and the bytes read per model byte: `read_bytes`
of /proc/self/io over the conversion (storage reads; the model files are evicted from the page cache
before each child with posix_fadvise(DONTNEED), so every model byte read counts) and, for trtpipe, the
converter's own count of HF tensor bytes read. Then auto's checkpoint is compared with modelopt's tensor by
tensor (bit-exact, the scales included) and file by file. Prints one JSON document; no thresholds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUNNERS = ("bare", "modelopt", "auto")
BIG = {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
       "vocab_size": 32000}


# ------------------------------------------------------------------------------------------------- models


def write_big_model(out: Path, layers: int) -> dict[str, int]:
    """A random bf16 Llama of 8B width, written tensor by tensor (the writer never holds the model)."""
    import torch
    from transformers import LlamaConfig, PreTrainedTokenizerFast

    from trtpipe.checkpoint.example_model import BOS_TOKEN, EOS_TOKEN, PAD_TOKEN, shipped_paragraphs, train_tokenizer
    from trtpipe.checkpoint.hf_source import expected_hf_shapes
    from trtpipe.checkpoint.rank_file import Layout, RankFileWriter

    out.mkdir(parents=True)
    config = LlamaConfig(**BIG, num_hidden_layers=layers, max_position_embeddings=4096, tie_word_embeddings=False,
                         bos_token_id=0, eos_token_id=1, pad_token_id=2, rope_theta=500000.0, dtype="bfloat16")
    config.architectures = ["LlamaForCausalLM"]
    config.save_pretrained(out)
    shapes = expected_hf_shapes(json.loads((out / "config.json").read_text()))
    writer = RankFileWriter(out / "model.safetensors", Layout({n: ("BF16", s) for n, s in shapes.items()},
                                                              metadata={"format": "pt"}))
    generator = torch.Generator().manual_seed(0)
    for name, shape in shapes.items():
        if len(shape) == 1:
            writer.write(name, torch.ones(shape, dtype=torch.bfloat16))
            continue
        step = max(1, (16 << 20) // shape[1])
        for start in range(0, shape[0], step):
            rows = min(step, shape[0] - start)
            writer.write(name, (torch.randn((rows, shape[1]), generator=generator) * 0.02).to(torch.bfloat16))
    writer.close()
    PreTrainedTokenizerFast(tokenizer_object=train_tokenizer(shipped_paragraphs()), bos_token=BOS_TOKEN,
                            eos_token=EOS_TOKEN, pad_token=PAD_TOKEN).save_pretrained(out)
    params = sum(int(torch.Size(s).numel()) for s in shapes.values())
    return {**BIG, "num_hidden_layers": layers, "params": params}


def write_tiny_model(out: Path) -> dict[str, int]:
    from trtpipe.checkpoint.example_model import write_example_model

    write_example_model(out, arch="llama")
    config = json.loads((out / "config.json").read_text())
    keys = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size",
            "num_hidden_layers")
    return {k: config[k] for k in keys}


def model_bytes(model: Path) -> int:
    return sum(p.stat().st_size for p in model.glob("*.safetensors"))


def evict(model: Path) -> None:
    """Drop the model files from the page cache, so the next child reads them from storage."""
    for path in model.iterdir():
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


# ------------------------------------------------------------------------------------------------- children


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _io() -> dict[str, int]:
    return {line.split(":")[0]: int(line.split()[1]) for line in Path("/proc/self/io").read_text().splitlines()}


def _calibration_windows(model: Path, samples: int, seq_len: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    from trtpipe.checkpoint.calibration import calibration_samples
    from trtpipe.checkpoint.example_model import shipped_paragraphs

    tokenizer = AutoTokenizer.from_pretrained(model)
    return calibration_samples(tokenizer, shipped_paragraphs(), samples=samples, max_seq_len=seq_len, seed=1234)


def run_bare(model: Path, out: Path, algo: str, samples: int, seq_len: int) -> dict[str, object]:
    """A bare ModelOpt script: load, quantize, export. No trtpipe in the conversion."""
    import warnings

    import modelopt.torch.quantization as mtq
    import torch
    from modelopt.torch.export import export_tensorrt_llm_checkpoint
    from transformers import AutoModelForCausalLM

    warnings.simplefilter("ignore")
    configs = {"none": None, "fp8": mtq.FP8_DEFAULT_CFG, "int4_awq": mtq.INT4_AWQ_CFG}
    windows = _calibration_windows(model, samples, seq_len) if configs[algo] is not None else []
    after_imports, io0, started = _status("VmHWM"), _io(), time.monotonic()
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16, low_cpu_mem_usage=True)
    if configs[algo] is not None:
        def loop(m: object) -> None:
            with torch.no_grad():
                for window in windows:
                    m(input_ids=torch.tensor([window]))  # type: ignore[operator]

        mtq.quantize(hf, configs[algo], loop)
    export_tensorrt_llm_checkpoint(hf, decoder_type="llama", dtype=torch.float16, export_dir=out,
                                   inference_tensor_parallel=1, inference_pipeline_parallel=1)
    return {"seconds": round(time.monotonic() - started, 2), "rss_after_imports_bytes": after_imports,
            "io": {k: v - io0[k] for k, v in _io().items()}}


def run_trtpipe(model: Path, out: Path, algo: str, samples: int, seq_len: int, converter: str) -> dict[str, object]:
    import torch  # noqa: F401  (imports are not conversion time)

    from trtpipe.checkpoint.recipes import convert_local

    # Imports are not conversion time; each path imports what it uses (the streaming path no ModelOpt and no
    # model class, which is part of its smaller peak).
    import transformers  # noqa: F401
    import safetensors.torch  # noqa: F401

    if converter == "modelopt" or algo != "none":
        import accelerate  # noqa: F401
        import modelopt.torch.export  # noqa: F401
        import modelopt.torch.quantization  # noqa: F401
        import transformers.models.llama.modeling_llama  # noqa: F401
    after_imports, io0, started = _status("VmHWM"), _io(), time.monotonic()
    summary = convert_local(model, out, algo=algo, samples=samples, max_seq_len=seq_len, dtype="float16",
                            converter=converter)
    return {"seconds": round(time.monotonic() - started, 2), "rss_after_imports_bytes": after_imports,
            "io": {k: v - io0[k] for k, v in _io().items()}, "path": summary.path,
            "converter_bytes_read": summary.bytes_read, "activation_bytes": summary.activation_bytes,
            "checkpoint_bytes": summary.total_bytes}


def child(runner: str, model: Path, out: Path, algo: str, samples: int, seq_len: int) -> None:
    if runner == "bare":
        figures = run_bare(model, out, algo, samples, seq_len)
    else:
        figures = run_trtpipe(model, out, algo, samples, seq_len, runner)
    figures["peak_rss_bytes"] = _status("VmHWM")
    print(json.dumps(figures))


# ------------------------------------------------------------------------------------------------- compare


def compare(reference: Path, candidate: Path) -> dict[str, object]:
    """Tensor by tensor (bit-exact) and file by file; the largest difference of any scale tensor."""
    import torch
    from safetensors import safe_open

    tensors = equal = 0
    differing: list[str] = []
    max_scale_diff = 0.0
    for path in sorted(reference.glob("rank*.safetensors")):
        with safe_open(str(path), "pt") as a, safe_open(str(candidate / path.name), "pt") as b:
            names = set(a.keys()) | set(b.keys())
            for name in sorted(names):
                tensors += 1
                if name not in a.keys() or name not in b.keys():
                    differing.append(name)
                    continue
                x, y = a.get_tensor(name), b.get_tensor(name)
                if x.dtype == y.dtype and x.shape == y.shape and torch.equal(x.view(torch.uint8), y.view(torch.uint8)):
                    equal += 1
                    continue
                differing.append(name)
                if "scaling_factor" in name and x.shape == y.shape:
                    max_scale_diff = max(max_scale_diff, float((x.float() - y.float()).abs().max()))
    files = sorted(p.name for p in reference.iterdir())
    same_files = files == sorted(p.name for p in candidate.iterdir()) and all(
        (reference / f).read_bytes() == (candidate / f).read_bytes() for f in files)
    return {"tensors": tensors, "tensors_identical": equal, "differing": differing[:10],
            "max_scale_abs_diff": max_scale_diff, "files_identical": same_files}


# ------------------------------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tiny,big", help="comma-separated: tiny, big")
    parser.add_argument("--formats", default="none,fp8,int4_awq", help="comma-separated spec algos")
    parser.add_argument("--runners", default=",".join(RUNNERS), help="comma-separated: bare, modelopt, auto")
    parser.add_argument("--big-layers", type=int, default=4, help="decoder layers of the big model (default 4)")
    parser.add_argument("--samples", type=int, default=8, help="calibration windows")
    parser.add_argument("--seq-len", type=int, default=128, help="calibration window length in tokens")
    parser.add_argument("--awq-samples", type=int, default=None, help="calibration windows for int4_awq on big")
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temp dir)")
    parser.add_argument("--child", nargs=4, metavar=("RUNNER", "MODEL", "OUT", "ALGO"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        runner, model, out, algo = args.child
        child(runner, Path(model), Path(out), algo, args.samples, args.seq_len)
        return

    results: dict[str, object] = {
        "benchmark": "convert",
        "host": {"machine": platform.machine(), "cpus": len(os.sched_getaffinity(0)), "python": platform.python_version()},
        "calibration": {"samples": args.samples, "max_seq_len": args.seq_len, "awq_samples_big": args.awq_samples},
        "export_dtype": "float16",
        "models": {},
    }
    if args.work is not None:
        Path(args.work).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.work) as scratch:
        work = Path(scratch)
        for which in args.models.split(","):
            model = work / which
            started = time.monotonic()
            shape = write_big_model(model, args.big_layers) if which == "big" else write_tiny_model(model)
            size = model_bytes(model)
            entry: dict[str, object] = {**shape, "bytes": size, "write_seconds": round(time.monotonic() - started, 2),
                                        "formats": {}}
            results["models"][which] = entry  # type: ignore[index]
            for algo in args.formats.split(","):
                samples = args.awq_samples if (algo == "int4_awq" and which == "big" and args.awq_samples) else args.samples
                runs: dict[str, object] = {}
                for runner in args.runners.split(","):
                    out = work / f"{which}-{algo}-{runner}"
                    evict(model)
                    proc = subprocess.run(
                        [sys.executable, __file__, "--samples", str(samples), "--seq-len", str(args.seq_len),
                         "--child", runner, str(model), str(out), algo], capture_output=True, text=True)
                    if proc.returncode != 0:
                        runs[runner] = {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1]}
                        continue
                    figures = json.loads(proc.stdout.strip().splitlines()[-1])
                    figures["peak_rss_over_model_bytes"] = round(figures["peak_rss_bytes"] / size, 3)
                    above = figures["peak_rss_bytes"] - figures["rss_after_imports_bytes"]
                    figures["peak_rss_above_imports_over_model_bytes"] = round(above / size, 3)
                    figures["read_bytes_over_model_bytes"] = round(figures["io"]["read_bytes"] / size, 3)
                    if figures.get("converter_bytes_read") is not None:
                        figures["converter_bytes_read_over_model_bytes"] = round(figures["converter_bytes_read"] / size, 3)
                    runs[runner] = figures
                if (work / f"{which}-{algo}-modelopt").is_dir() and (work / f"{which}-{algo}-auto").is_dir():
                    runs["auto_vs_modelopt"] = compare(work / f"{which}-{algo}-modelopt", work / f"{which}-{algo}-auto")
                entry["formats"][algo] = {"calibration_samples": samples, **runs}  # type: ignore[index]
                for runner in RUNNERS:
                    shutil.rmtree(work / f"{which}-{algo}-{runner}", ignore_errors=True)
                print(json.dumps({which: {algo: entry["formats"][algo]}}), file=sys.stderr, flush=True)  # type: ignore[index]
            shutil.rmtree(model, ignore_errors=True)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
