"""Layer-by-layer calibration: ModelOpt's quantizers on one decoder layer at a time give the full-model
calibration's scales and weights, tensor by tensor, and so the same checkpoint bytes.

Each case converts twice: `quantization.converter: modelopt` (the whole model in `mtq.quantize`, then
`export_tensorrt_llm_checkpoint`) and the automatic choice (layer-wise here). Every tensor of every rank is
compared (its bytes, so a scale that differs in its last bit fails, and the message names it), then
config.json and the files. Parity against transformers is tests/checkpoint/test_heads.py's (same bytes, same
parity). Memory and time are measured by benchmarks/convert.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from trtpipe.checkpoint.recipes import convert_local

pytestmark = pytest.mark.timeout(900)

SAMPLES, SEQ_LEN = 8, 64
# (algo, kv_cache, tp, pp): each calibrated format, the FP8 KV cache (whose quantizers change the second AWQ pass),
# TP 2 and PP 2.
CASES = (
    ("fp8", "auto", 1, 1),
    ("fp8", "fp8", 2, 1),
    ("int4_awq", "auto", 2, 1),
    ("int4_awq", "fp8", 1, 2),
    ("w4a8_awq", "fp8", 1, 1),
    ("int8_sq", "auto", 2, 1),
)


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(path), "pt") as f:
        return {name: f.get_tensor(name) for name in f.keys()}


def _differences(reference: Path, layerwise: Path) -> list[str]:
    """Every tensor (and file) that is not bit-identical, named."""
    problems = []
    for path in sorted(reference.glob("rank*.safetensors")):
        want, have = _tensors(path), _tensors(layerwise / path.name)
        problems += [f"{path.name}: {name} missing" for name in sorted(set(want) - set(have))]
        problems += [f"{path.name}: {name} extra" for name in sorted(set(have) - set(want))]
        for name in sorted(set(want) & set(have)):
            a, b = want[name], have[name]
            if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a.view(torch.uint8), b.view(torch.uint8)):
                problems.append(f"{path.name}: {name} differs")
    for name in sorted(p.name for p in reference.iterdir()):
        if not problems and (reference / name).read_bytes() != (layerwise / name).read_bytes():
            problems.append(f"{name} differs")
    return problems


@pytest.mark.parametrize(("algo", "kv_cache", "tp", "pp"), CASES, ids=[f"{a}-kv{k}-tp{t}-pp{p}" for a, k, t, p in CASES])
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral"])
def test_layerwise_equals_full_model(
    example_model_dir: Callable[..., Path], tmp_path: Path, arch: str, tied: bool, algo: str, kv_cache: str, tp: int,
    pp: int,
) -> None:
    model = example_model_dir(arch, tied)
    recipe = dict(algo=algo, kv_cache=kv_cache, tp=tp, pp=pp, samples=SAMPLES, max_seq_len=SEQ_LEN)
    reference = Path(convert_local(model, tmp_path / "modelopt", converter="modelopt", **recipe).out_dir)
    summary = convert_local(model, tmp_path / "layerwise", **recipe)
    assert summary.path == "layerwise", summary.path_reason
    assert _differences(reference, Path(summary.out_dir)) == []
    assert summary.calibration is not None and summary.calibration.samples_used == SAMPLES


def test_scales_are_calibrated_not_copied(tiny_llama_dir: Path, tmp_path: Path) -> None:
    """The comparison above would also pass if both paths wrote constants: the scales follow the data."""
    one = convert_local(tiny_llama_dir, tmp_path / "a", algo="fp8", samples=SAMPLES, max_seq_len=SEQ_LEN)
    other = convert_local(tiny_llama_dir, tmp_path / "b", algo="fp8", samples=2, max_seq_len=SEQ_LEN, seed=7)
    a, b = _tensors(Path(one.out_dir) / "rank0.safetensors"), _tensors(Path(other.out_dir) / "rank0.safetensors")
    scales = [n for n in a if n.endswith("activation_scaling_factor")]
    assert scales and any(not torch.equal(a[n], b[n]) for n in scales)


# What layer-wise calibration holds at once besides one layer: the activations entering the layer and those it
# produces, per distinct calibration pass. FP8: one pass (in + out). AWQ: a caching and a search pass, whose
# outputs are equal unless the FP8 KV cache quantizers (enabled after the first pass) change the second.
ACTIVATION_COPIES = {("fp8", "auto"): 2, ("fp8", "fp8"): 2, ("int4_awq", "auto"): 3, ("int4_awq", "fp8"): 4}


@pytest.mark.parametrize(("algo", "kv_cache"), sorted(ACTIVATION_COPIES))
def test_activation_memory_is_what_the_docstring_states(tiny_llama_dir: Path, tmp_path: Path, algo: str,
                                                         kv_cache: str) -> None:
    summary = convert_local(tiny_llama_dir, tmp_path / "ck", algo=algo, kv_cache=kv_cache, samples=SAMPLES,
                            max_seq_len=SEQ_LEN)
    hidden = json.loads((tiny_llama_dir / "config.json").read_text())["hidden_size"]
    one_copy = summary.calibration.tokens * hidden * 2  # bfloat16
    assert summary.activation_bytes == ACTIVATION_COPIES[(algo, kv_cache)] * one_copy


def test_layerwise_never_loads_the_model(tiny_llama_dir: Path, tmp_path: Path) -> None:
    """With transformers' model loader disabled, the layer-wise path converts; ModelOpt's path cannot."""
    def convert(out: str, converter: str) -> subprocess.CompletedProcess[str]:
        script = (
            "from pathlib import Path\n"
            "import transformers\n"
            "def refuse(*a, **k): raise RuntimeError('from_pretrained called')\n"
            "transformers.AutoModelForCausalLM.from_pretrained = refuse\n"
            "from trtpipe.checkpoint.recipes import convert_local\n"
            f"s = convert_local(Path({str(tiny_llama_dir)!r}), Path({str(tmp_path / out)!r}), algo='int4_awq', "
            f"kv_cache='fp8', samples=4, max_seq_len=32, converter={converter!r})\n"
            "print(s.path)\n"
        )
        return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)

    out = convert("layerwise", "auto")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "layerwise"
    out = convert("modelopt", "modelopt")
    assert out.returncode != 0 and "from_pretrained called" in out.stderr
