"""The parity check can fail: deliberately broken checkpoints are caught.

Measured relative logit errors and top-1 rates are listed in test_quantized_parity.py. Top-1 agreement alone
is a weak gate (a single swapped layer keeps two thirds of the top-1 tokens); the relative error of a broken
checkpoint is 10x or more above the correct one's, so the verdict needs it.
"""

from __future__ import annotations

import pytest

import json
from pathlib import Path

from trtpipe.reference.parity import bounds_for, check_parity

pytestmark = pytest.mark.timeout(900)


def _formats(ckpt: Path) -> tuple[str | None, str | None]:
    quant = json.loads((ckpt / "config.json").read_text())["quantization"]
    return quant.get("quant_algo"), quant.get("kv_cache_quant_algo")


@pytest.mark.parametrize(
    ("arch", "algo", "tp", "kv_cache"),
    [("llama", "none", 1, "auto"), ("qwen2", "none", 2, "auto"), ("llama", "int4_awq", 2, "fp8")],
    ids=["llama-fp16", "qwen2-fp16-tp2", "llama-int4-tp2"],
)
@pytest.mark.parametrize("breakage", ["fc-gate-swapped", "k-before-q"])
def test_broken_checkpoint_fails_parity(arch, algo, tp, kv_cache, breakage, converted, hf_dirs, prompts, surgery, tmp_path):
    good = converted(arch, algo, tp=tp, kv_cache=kv_cache)
    if breakage == "fc-gate-swapped":
        bad = surgery.swap_fc_and_gate(good, tmp_path / "broken")
    else:
        bad = surgery.put_k_before_q(good, tmp_path / "broken")
    # The correct checkpoints pass these same default bounds in test_fp16_parity / test_quantized_parity.
    bounds = bounds_for(*_formats(good)).model_copy(update={"greedy_tokens": 4})
    broken = check_parity(hf_dirs[arch], bad, prompts, bounds=bounds)
    print(f"{arch} {algo} tp{tp} {breakage}: broken rel={broken.max_rel_error:.4f} top1={broken.top1_agreement:.3f}")
    assert not broken.passed
    assert any("relative logit error" in f for f in broken.failures), broken.failures
    assert broken.max_rel_error > 2 * bounds.max_rel_error


def test_single_layer_int4_swap_is_caught_by_relative_error(converted, hf_dirs, prompts, surgery, tmp_path):
    """fc/gate swapped in the last layer only of an INT4 checkpoint: the relative error alone fails it."""
    good = converted("llama", "int4_awq", tp=2, kv_cache="fp8")
    bad = surgery.swap_fc_and_gate(good, tmp_path / "broken", layers={1})
    bounds = bounds_for(*_formats(good)).model_copy(update={"greedy_tokens": 4})
    report = check_parity(hf_dirs["llama"], bad, prompts, bounds=bounds)
    print(f"int4 last-layer swap: rel={report.max_rel_error:.4f} top1={report.top1_agreement:.3f}")
    assert not report.passed
    # The relative error bound alone fails it (the top-1 rate drops too on this model, but far less).
    assert report.max_rel_error > bounds.max_rel_error
    assert any("relative logit error" in f for f in report.failures)
