"""GPU calibration against CPU calibration, for the tiny example model: prints one JSON object.

The checkpoint stage of a GPU target converts on the GPU builder (`convert_checkpoint(device="cuda")`,
run by the engine's executor). This script converts the same spec twice in one process, once with
`device="cpu"` and once with `device="cuda"`, and compares the two checkpoints tensor by tensor:
- FP8: the quantized weights must be bit-identical and each weight scale within 4 float32 ulps (the
  weight's amax is the same number on any device; the scale's arithmetic may round once differently);
- activation (and KV-cache) scales come from calibration forward passes, whose floating-point
  reductions differ between devices: their largest relative difference is reported, not asserted;
- INT4-AWQ: AWQ searches each layer's pre-quantization scale on the calibration activations, so the
  chosen scales, and with them the packed weights, follow the device's arithmetic: reported, not asserted;
- wall time of each conversion (model load, calibration, export; the CPU figure is the baseline).
It needs a CUDA device, ModelOpt and transformers at the toolchain's pins; it needs no TensorRT-LLM.

Usage: python benchmarks/gpu_conversion.py [--algos fp8,int4_awq] [--out FILE] [--device-only cpu]
(`--device-only cpu` runs both halves on the CPU, to check the script itself on a machine with no GPU.)
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _spec(folder: Path, model: Path, algo: str) -> Path:
    path = folder / f"tiny-{algo}.yaml"
    path.write_text(
        f"name: tiny-gpu-check\nmodel: {{path: {model}, dtype: float16}}\n"
        "target: {gpu: h200, executor: local}\n"
        f"quantization: {{algo: {algo}, calibration: {{samples: 16, max_seq_len: 64}}}}\n"
        "engine: {max_batch_size: 4, max_input_len: 64, max_seq_len: 128}\n",
        encoding="utf-8",
    )
    return path


def _compare(cpu_dir: Path, gpu_dir: Path) -> dict:
    import torch
    from safetensors.torch import load_file

    cpu, gpu = load_file(str(cpu_dir / "rank0.safetensors")), load_file(str(gpu_dir / "rank0.safetensors"))
    identical, differing, missing = [], {}, sorted(set(cpu) ^ set(gpu))
    for name in sorted(set(cpu) & set(gpu)):
        a, b = cpu[name], gpu[name]
        if a.dtype != b.dtype or a.shape != b.shape:
            differing[name] = {"why": f"{a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"}
            continue
        if a.contiguous().view(torch.uint8).equal(b.contiguous().view(torch.uint8)):
            identical.append(name)
            continue
        if a.dtype.is_floating_point and a.element_size() >= 2:
            rel = float(((a.float() - b.float()).abs() / a.float().abs().clamp_min(1e-12)).max())
        else:
            rel = None  # float8 / int8 / packed int4: only bit equality is meaningful
        differing[name] = {"max_rel_diff": rel}
    weights = [n for n in set(cpu) & set(gpu) if n.endswith(".weight")]
    weight_scales = [n for n in set(cpu) & set(gpu) if n.endswith("weights_scaling_factor")]
    ulp4 = 4 * 2.0**-23
    return {
        "tensors": len(set(cpu) | set(gpu)),
        "identical": len(identical),
        "missing_in_one": missing,
        "weights_identical": all(n in identical for n in weights),
        "weight_scales_within_4_ulps": all(
            n in identical or (differing[n].get("max_rel_diff") or 1.0) <= ulp4 for n in weight_scales),
        "differing": differing,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algos", default="fp8,int4_awq")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--device-only", choices=("cpu", "cuda"), help="run both halves on one device")
    args = parser.parse_args()

    import torch

    from trtpipe.checkpoint.convert import convert_checkpoint
    from trtpipe.checkpoint.example_model import write_example_model
    from trtpipe.resolve import resolve
    from trtpipe.spec_loader import load_spec

    second = args.device_only or "cuda"
    result: dict = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "devices_compared": ["cpu" if args.device_only is None else args.device_only, second],
        "runs": {},
    }
    with tempfile.TemporaryDirectory(prefix="gpu-conversion-") as tmp:
        root = Path(tmp)
        model = root / "tiny-llama"
        write_example_model(model, arch="llama")
        for algo in args.algos.split(","):
            resolved = resolve(load_spec(_spec(root, model, algo)))
            run: dict = {}
            dirs = {}
            for device in result["devices_compared"] if args.device_only is None else [second, second]:
                label = f"{device}{len(dirs)}" if device in dirs else device
                out = root / f"{algo}-{label}"
                out.mkdir()
                started = time.perf_counter()
                convert_checkpoint(resolved, out, device=device)
                if device == "cuda":
                    torch.cuda.synchronize()
                run[f"{label}_seconds"] = round(time.perf_counter() - started, 3)
                dirs[label] = out
            first, other = list(dirs.values())
            run["comparison"] = _compare(first, other)
            result["runs"][algo] = run
    text = json.dumps(result, indent=1)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n", encoding="utf-8")
    fp8 = result["runs"].get("fp8")
    ok = fp8 is None or (fp8["comparison"]["weights_identical"] and fp8["comparison"]["weight_scales_within_4_ulps"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
