"""What the model means survives conversion (trtpipe.model_semantics): attention windows, padded vocabularies, rope
scaling, an explicit head_dim, a tied head with QKV bias, checked against transformers on the original model.

The test models are trtpipe's tiny example model (trained 100 steps, so greedy output is not degenerate) with one
semantic field changed each (trtpipe.checkpoint.example_model.Variant)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from trtpipe import model_semantics
from trtpipe.reference.parity import check_parity, hf_greedy
from trtpipe.reference.runtime import ReferenceModel

pytestmark = pytest.mark.timeout(900)

WINDOW = 32  # the mistral-window model's (tests/conftest.py SEMANTIC_VARIANTS)
# fp16 tolerance, as tests/reference/test_fp16_parity.py states it: both sides compute in float32 from the same fp16
# weights (summation order and RoPE table rounding only); measured below 1e-3 there, 1e-2 is the margin.
FP16_REL_ERROR = 1e-2


@pytest.fixture(scope="module")
def models(semantic_model):
    return semantic_model


def _convert(model_dir: Path, out: Path, algo: str = "none", *, tp: int = 1, group_size: int = 128) -> Path:
    from trtpipe.checkpoint.convert import convert_checkpoint
    from trtpipe.resolve import resolve
    from trtpipe.spec_loader import load_spec

    spec = out.parent / f"{out.name}.yaml"
    spec.write_text(f"name: sem\nmodel: {{path: {json.dumps(str(model_dir))}, dtype: float16}}\n"
                    f"target: {{gpu: cpu-reference, tp: {tp}}}\n"
                    f"quantization: {{algo: {algo}, group_size: {group_size}, calibration: {{samples: 8}}}}\n"
                    "engine: {max_input_len: 256, max_seq_len: 512}\n")
    out.mkdir()
    convert_checkpoint(resolve(load_spec(spec)), out, show_progress=False)
    return out


def _long_prompt(model_dir: Path, tokens: int) -> list[int]:
    from tokenizers import Tokenizer

    from trtpipe.checkpoint.example_model import shipped_paragraphs

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    ids = tokenizer.encode(" ".join(shipped_paragraphs()), add_special_tokens=True).ids
    return ids[:tokens]


def test_windows_follow_transformers_reading_of_config_json() -> None:
    base = {"num_hidden_layers": 4, "model_type": "mistral"}
    assert model_semantics.layer_windows({**base, "sliding_window": 32}) == [32] * 4
    assert model_semantics.layer_windows({**base, "sliding_window": None}) == [None] * 4
    qwen = {"num_hidden_layers": 4, "model_type": "qwen2", "sliding_window": 16, "max_window_layers": 2}
    assert model_semantics.layer_windows(qwen) == [None] * 4  # use_sliding_window is off by default
    assert model_semantics.layer_windows({**qwen, "use_sliding_window": True}) == [None, None, 16, 16]
    typed = {**base, "sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"] * 2}
    assert model_semantics.layer_windows(typed) == [8, None, 8, None]
    # What the runtime is given: a window shorter than max_seq_len, full layers at max_seq_len; none when no layer's
    # window binds (full attention is then exact).
    assert model_semantics.window_parameter(typed, 512) == "8,512,8,512"
    assert model_semantics.window_parameter({**base, "sliding_window": 4096}, 2048) == "2048"
    assert model_semantics.attention_windows({**base, "sliding_window": 4096}, 2048) is None


def test_a_sliding_window_matches_transformers_token_for_token_past_the_window(models, tmp_path: Path) -> None:
    """The acceptance's core: a 32-token window, 128-token prompts, greedy tokens equal to transformers'."""
    hf_dir = models("mistral-window")
    ckpt = _convert(hf_dir, tmp_path / "ckpt")
    windows = model_semantics.attention_windows(json.loads((hf_dir / "config.json").read_text()), 512)
    assert windows == [WINDOW, WINDOW]
    prompts = [_long_prompt(hf_dir, 128), _long_prompt(hf_dir, 100)[3:]]
    windowed = ReferenceModel.load(ckpt).set_attention_windows(windows)
    report = check_parity(hf_dir, ckpt, prompts, reference=windowed)
    assert report.passed and report.max_rel_error < FP16_REL_ERROR, report.failures
    # Without the window the same runtime is another model past position 32: the check can tell.
    full = check_parity(hf_dir, ckpt, prompts, reference=ReferenceModel.load(ckpt))
    assert not full.passed and full.max_rel_error > 10 * report.max_rel_error
    greedy = hf_greedy(hf_dir, prompts, 24, end_id=None)
    ours = [[t.token_id for t in windowed.generate(p, max_new_tokens=24, top_k=1)] for p in prompts]
    assert ours == greedy


@pytest.fixture(scope="module")
def awq_vocab_1001(models, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 1001-id model at INT4-AWQ, tp 2 (group 64: 128-wide per-rank inputs)."""
    return _convert(models("vocab-1001"), tmp_path_factory.mktemp("awq1001") / "ckpt", "int4_awq", tp=2, group_size=64)


# Each semantic field at the formats that exercise it (the quantized formats themselves are covered per architecture
# by tests/reference/test_quantized_parity.py): rope scaling and the tied head with QKV bias unquantized, split over
# tp 2 where the field touches the split (heads, the tied head); the explicit head_dim also at FP8.
@pytest.mark.parametrize("name,algo,tp", [
    ("llama3-rope", "none", 1), ("mha-head-dim", "none", 2), ("mha-head-dim", "fp8", 1), ("qwen2-tied", "none", 2),
])
def test_each_semantic_field_survives_conversion(models, tmp_path: Path, name: str, algo: str, tp: int) -> None:
    """Logits against transformers within the format's bounds on prompts past the rope threshold (64 positions)."""
    hf_dir = models(name)
    ckpt = _convert(hf_dir, tmp_path / "ckpt", algo, tp=tp)
    prompts = [_long_prompt(hf_dir, 96), _long_prompt(hf_dir, 40)]
    report = check_parity(hf_dir, ckpt, prompts)
    assert report.passed, report.failures


def test_a_padded_vocabulary_converts_within_its_bounds(models, awq_vocab_1001: Path) -> None:
    hf_dir = models("vocab-1001")
    report = check_parity(hf_dir, awq_vocab_1001, [_long_prompt(hf_dir, 96), _long_prompt(hf_dir, 40)])
    assert report.passed, report.failures


def test_a_padded_vocabulary_is_never_sampled(awq_vocab_1001: Path) -> None:
    """INT4-AWQ pads the 1001-id vocabulary to 1024 zero rows; at temperature 1 over 10,000 draws the runtime never
    returns an id past 1000 once it knows the tokenizer's size, and does without it (the check can fail)."""
    ckpt = awq_vocab_1001
    assert json.loads((ckpt / "config.json").read_text())["vocab_size"] == 1024

    def draws(model: ReferenceModel) -> list[int]:
        out: list[int] = []
        for seed in range(100):
            out += [t.token_id for t in model.generate([0, 11, 42, 7], max_new_tokens=100, temperature=1.0, top_k=0,
                                                       top_p=1.0, seed=seed)]
        return out

    masked = draws(ReferenceModel.load(ckpt).set_token_vocab_size(1001))
    assert len(masked) == 10_000 and max(masked) <= 1000
    # Without the mask the padded rows are live: their logits are exactly 0 (zero rows), so they hold real mass at
    # temperature 1 (issue 30 measured 0.53 % on average), which the sampler would hand out.
    logits = ReferenceModel.load(ckpt).logits([0, 11, 42, 7])[-1]
    assert torch.all(logits[1001:] == 0)
    padded_mass = float(torch.softmax(logits, dim=-1)[1001:].sum())
    assert padded_mass > 1e-4, padded_mass


def test_resolve_refuses_what_no_runtime_computes(tmp_path: Path, tiny_llama_dir: Path) -> None:
    import shutil

    from trtpipe.errors import TrtpipeError
    from trtpipe.resolve import resolve
    from trtpipe.spec_loader import load_spec

    model = tmp_path / "yarn"
    shutil.copytree(tiny_llama_dir, model)
    config = json.loads((model / "config.json").read_text())
    config["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512}
    (model / "config.json").write_text(json.dumps(config))
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"model: {{path: {json.dumps(str(model))}, dtype: float16}}\ntarget: {{gpu: cpu-reference}}\n")
    with pytest.raises(TrtpipeError, match="rope_type 'yarn' is not computed by the cpu-reference runtime"):
        resolve(load_spec(spec))


def test_the_mistral_7b_example_plans_with_its_4096_window() -> None:
    """The shipped Mistral-7B (v0.1) example at 16k context: the plan sizes the KV cache with the window and the
    repository's runtime parameter is 4096."""
    from trtpipe.plan import memory_plan
    from trtpipe.resolve import resolve
    from trtpipe.spec_loader import load_spec

    resolved = resolve(load_spec(Path("build_configs/examples/mistral-7b-fp8-h100.yaml")), need_weights=False)
    assert resolved.spec.limits.max_seq_len == 16384
    plan = memory_plan(resolved)
    assert plan.attention_window == "4096"
    assert model_semantics.window_parameter(resolved.model_config, 16384) == "4096"
    full_plan_sequences = plan.kv_tokens // 16384
    assert plan.sequences_at_max_seq_len >= 3 * full_plan_sequences  # 4096 of 16384 tokens kept per layer


def test_every_semantic_field_says_how_each_runtime_keeps_it() -> None:
    from trtpipe.toolchain import BACKEND_KINDS, backend_facts

    # Every registered backend's runtime has its column (a backend on a new runtime needs one), and no column is
    # for a runtime nothing runs.
    assert set(model_semantics.RUNTIMES) == {backend_facts(kind).runtime for kind in BACKEND_KINDS}
    for row in model_semantics.TABLE:
        assert set(row.handling) == set(model_semantics.RUNTIMES), row.field
        assert all(h.where for h in row.handling.values()), row.field


def test_fp8_kv_scales_at_their_floor_are_said(tiny_llama_dir: Path, tmp_path: Path) -> None:
    """ModelOpt floors calibrated KV scales at 1.0; on the tiny model every one lands there, and the summary says so."""
    from trtpipe.checkpoint.convert import convert_checkpoint, kv_scale_notes
    from trtpipe.resolve import resolve
    from trtpipe.spec_loader import load_spec

    spec = tmp_path / "kv.yaml"
    spec.write_text(f"model: {{path: {json.dumps(str(tiny_llama_dir))}, dtype: float16}}\n"
                    "target: {gpu: cpu-reference}\nquantization: {algo: fp8, kv_cache: fp8, calibration: {samples: 8}}\n")
    out = tmp_path / "ckpt"
    out.mkdir()
    summary = convert_checkpoint(resolve(load_spec(spec)), out, show_progress=False)
    assert summary.notes and "all 1.0" in summary.notes[0]
    # The note follows the scales: one scale off the floor and it is gone.
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(out / "rank0.safetensors"))
    name = next(k for k in tensors if k.endswith("kv_cache_scaling_factor"))
    tensors[name] = tensors[name] * 2
    save_file(tensors, str(out / "rank0.safetensors"))
    assert kv_scale_notes(out) == []
