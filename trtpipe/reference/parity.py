"""Numerical parity between the CPU reference runtime and transformers on the original HF model.

For each prompt: the relative logit error ||ref - hf|| / ||hf|| over all positions (Frobenius norm of the
[len, vocab] logits), the top-1 agreement rate over positions, and whether N greedy tokens are identical.
A `ParityReport` gives the verdict against `ParityBounds`, whose defaults per quantization format are
`DEFAULT_BOUNDS` (measured on trtpipe's tiny example models; see tests/reference/test_quantized_parity.py).

Top-1 agreement alone is too weak a gate: on the tiny example Llama, an INT4 checkpoint with mlp.fc and
mlp.gate swapped in one layer still agrees on two thirds of the top-1 tokens, while its relative error is
14x the correct checkpoint's (0.25 vs 0.018), so every verdict needs both.

transformers is imported only inside `check_parity` (the runtime itself stays light).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, Field

from trtpipe import quant
from trtpipe.errors import InvalidInput, NotFound, UsageError
from trtpipe.reference.runtime import ReferenceModel


class ParityBounds(BaseModel):
    """What a conversion must meet to pass parity."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_rel_error: float = Field(gt=0, description="Upper bound on every prompt's relative logit error.")
    min_top1_agreement: float = Field(ge=0, le=1, description="Lower bound on top-1 agreement over all positions.")
    greedy_tokens: int = Field(default=32, ge=0, description="Greedy continuation length compared per prompt.")
    require_greedy_equal: bool = Field(
        default=False, description="Fail unless every greedy continuation is identical (unquantized formats)."
    )


def _bounds(bound: quant.ParityBound) -> ParityBounds:
    return ParityBounds(max_rel_error=bound.max_rel_error, min_top1_agreement=bound.min_top1_agreement,
                        require_greedy_equal=bound.require_greedy_equal)


# Bounds per checkpoint format (quant_algo, with "+FP8KV" when the KV cache is FP8), from the quantization
# table (trtpipe.quant: `parity`, `parity_with_kv`). The numbers come from measurements of correct
# conversions of the tiny example Llama and Qwen2 (TP=1 and 2) against the same conversions deliberately
# broken; each bound sits between the worst correct value and the best broken one with margin on both
# sides. The measurements are recorded in tests/reference/test_quantized_parity.py next to the tests that
# enforce them.
def _default_bounds() -> dict[str, ParityBounds]:
    bounds: dict[str, ParityBounds] = {}
    for fmt in quant.FORMATS.values():
        if fmt.parity is not None:
            bounds[format_key(fmt.checkpoint_algo, None)] = _bounds(fmt.parity)
        for kv, bound in fmt.parity_with_kv.items():
            bounds[format_key(fmt.checkpoint_algo, quant.KV_CACHES[kv].checkpoint_algo)] = _bounds(bound)
    return bounds


def format_key(quant_algo: str | None, kv_cache_quant_algo: str | None) -> str:
    key = quant_algo or "none"
    if kv_cache_quant_algo is not None:
        key += f"+{kv_cache_quant_algo}KV"
    return key


DEFAULT_BOUNDS: dict[str, ParityBounds] = _default_bounds()


def bounds_for(quant_algo: str | None, kv_cache_quant_algo: str | None = None) -> ParityBounds:
    """Default bounds for a checkpoint format."""
    key = format_key(quant_algo, kv_cache_quant_algo)
    if key in DEFAULT_BOUNDS:
        return DEFAULT_BOUNDS[key]
    if quant_algo in DEFAULT_BOUNDS:  # e.g. FP8 KV on a format without its own entry
        base = DEFAULT_BOUNDS[quant_algo or "none"]
        return base.model_copy(update={"max_rel_error": base.max_rel_error * 1.2, "require_greedy_equal": False})
    raise InvalidInput(f"no parity bounds for checkpoint format {key}", fix="pass bounds= explicitly")


class ParityReference(BaseModel):
    """What `smoke --parity` compares a server with: the spec's model converted afresh (`engine_dir`, run by the
    reference runtime with the model's attention windows and tokenizer vocabulary, which a checkpoint does not carry),
    and, when it is here, the original model itself (`hf_dir`, run by transformers)."""

    engine_dir: Path
    tokenizer_dir: Path
    hf_dir: Path | None = None  # the original HF model; None: not available (or too large to run here)
    hf_skipped: str | None = None  # why there is no hf_dir
    attention_windows: list[int] | None = None
    token_vocab_size: int | None = None
    exact: bool = True  # an unquantized conversion: the served greedy tokens must equal transformers'
    threshold_tokens: int | None = Field(default=None, description="The longest attention window or rope-scaling "
                                         "threshold the model has below max_seq_len; None: none.")
    max_input_len: int | None = None  # the engine's limits, which long prompts stay within
    max_seq_len: int | None = None

    def long_prompt_tokens(self, max_tokens: int) -> int | None:
        """Prompts 4x the threshold long (past every window), within the engine's limits; None without a threshold."""
        if not self.threshold_tokens:
            return None
        room = [4 * self.threshold_tokens]
        if self.max_input_len:
            room.append(self.max_input_len)
        if self.max_seq_len:
            room.append(self.max_seq_len - max_tokens)
        length = min(room)
        return length if length > self.threshold_tokens else None


class PromptParity(BaseModel):
    index: int
    num_tokens: int
    rel_error: float
    top1_agreement: float
    greedy_reference: list[int]
    greedy_hf: list[int]
    greedy_match_prefix: int
    greedy_equal: bool


class ParityReport(BaseModel):
    hf_dir: str
    checkpoint_dir: str
    format: str
    bounds: ParityBounds
    prompts: list[PromptParity]
    max_rel_error: float
    mean_rel_error: float
    top1_agreement: float
    greedy_equal_all: bool
    passed: bool
    failures: list[str]


def _hf_logits_and_greedy(
    model: torch.nn.Module, prompt: Sequence[int], steps: int, vocab: int
) -> tuple[torch.Tensor, list[int]]:
    """transformers' float32 logits [len, vocab] for the prompt, and its greedy continuation (KV-cached)."""
    with torch.no_grad():
        out = model(torch.tensor([list(prompt)]), use_cache=True)
        logits = out.logits[0, :, :vocab].to(torch.float32)
        tokens: list[int] = []
        next_logits, past = logits[-1], out.past_key_values
        for step in range(steps):
            token = int(torch.argmax(next_logits))
            tokens.append(token)
            if step + 1 < steps:
                out = model(torch.tensor([[token]]), past_key_values=past, use_cache=True)
                next_logits, past = out.logits[0, -1, :vocab].to(torch.float32), out.past_key_values
    return logits, tokens


def hf_greedy(hf_dir: Path, prompts: Sequence[Sequence[int]], max_tokens: int, end_id: int | None) -> list[list[int]]:
    """transformers' greedy continuation of each prompt on the original model (float32; the model's own attention
    window, rope scaling and vocabulary), stopped before the end token as TensorRT-LLM does."""
    model = _load_hf(Path(hf_dir))
    vocab = int(model.config.vocab_size)
    out = []
    for prompt in prompts:
        _, tokens = _hf_logits_and_greedy(model, prompt, max_tokens, vocab)
        if end_id is not None and end_id in tokens:
            tokens = tokens[: tokens.index(end_id)]
        out.append(tokens)
    return out


def _load_hf(hf_dir: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM  # heavy: imported only when parity runs

    if not (hf_dir / "config.json").is_file():
        raise NotFound(f"{hf_dir}/config.json not found", what="model", ref=str(hf_dir),
                       fix="point hf_dir at the HF model the checkpoint came from")
    if not any(hf_dir.glob("*.safetensors")):
        raise InvalidInput(f"{hf_dir} has no .safetensors weights", fix="parity loads safetensors only")
    model = AutoModelForCausalLM.from_pretrained(
        hf_dir, dtype=torch.float32, trust_remote_code=False, use_safetensors=True
    )
    return model.eval()


def _checkpoint_quantization(path: Path) -> tuple[str | None, str | None]:
    """(quant_algo, kv_cache_quant_algo) of a TRT-LLM checkpoint, reference engine or HF-format checkpoint."""
    from trtpipe.reference import hf_loader

    if hf_loader.is_hf_checkpoint(path):
        algo, kv_algo, _ = hf_loader.hf_quantization(path)
        return algo, kv_algo
    raw = json.loads((path / "config.json").read_text(encoding="utf-8"))
    quant = raw.get("pretrained_config", raw).get("quantization") or {}
    return quant.get("quant_algo"), quant.get("kv_cache_quant_algo")


def _checkpoint_format(path: Path) -> str:
    return format_key(*_checkpoint_quantization(path))


def check_parity(
    hf_dir: Path,
    ckpt_or_engine_dir: Path,
    prompts: list[list[int]],
    *,
    bounds: ParityBounds | None = None,
    reference: ReferenceModel | None = None,
) -> ParityReport:
    """Compare the reference runtime on `ckpt_or_engine_dir` (a TRT-LLM checkpoint, a reference engine or a
    Hugging Face-format llm-api checkpoint) with transformers on `hf_dir`.

    `bounds` defaults to `DEFAULT_BOUNDS` for the checkpoint's format. `reference` may pass an already
    loaded model of `ckpt_or_engine_dir` to skip loading it again.
    """
    hf_dir, ckpt_or_engine_dir = Path(hf_dir), Path(ckpt_or_engine_dir)
    if not prompts or any(len(p) == 0 for p in prompts):
        raise UsageError("parity needs at least one non-empty prompt", fix="pass token id lists")
    fmt = _checkpoint_format(ckpt_or_engine_dir)
    if bounds is None:
        bounds = bounds_for(*_checkpoint_quantization(ckpt_or_engine_dir))
    ref = reference if reference is not None else ReferenceModel.load(ckpt_or_engine_dir)
    hf = _load_hf(hf_dir)
    vocab = min(ref.config.vocab_size, int(hf.config.vocab_size))

    results: list[PromptParity] = []
    agree_total, positions_total = 0, 0
    for index, prompt in enumerate(prompts):
        hf_logits, greedy_hf = _hf_logits_and_greedy(hf, prompt, bounds.greedy_tokens, vocab)
        ref_logits = ref.logits(prompt)[:, :vocab]
        rel = float(torch.linalg.norm(ref_logits - hf_logits) / torch.linalg.norm(hf_logits))
        agree = int((ref_logits.argmax(-1) == hf_logits.argmax(-1)).sum())
        agree_total += agree
        positions_total += len(prompt)
        greedy_ref = [t.token_id for t in ref.generate(prompt, max_new_tokens=bounds.greedy_tokens, top_k=1)]
        prefix = 0
        while prefix < min(len(greedy_ref), len(greedy_hf)) and greedy_ref[prefix] == greedy_hf[prefix]:
            prefix += 1
        results.append(
            PromptParity(
                index=index,
                num_tokens=len(prompt),
                rel_error=rel,
                top1_agreement=agree / len(prompt),
                greedy_reference=greedy_ref,
                greedy_hf=greedy_hf,
                greedy_match_prefix=prefix,
                greedy_equal=greedy_ref == greedy_hf,
            )
        )

    max_rel = max(r.rel_error for r in results)
    top1 = agree_total / positions_total
    greedy_all = all(r.greedy_equal for r in results)
    failures: list[str] = []
    if max_rel > bounds.max_rel_error:
        worst = max(results, key=lambda r: r.rel_error)
        failures.append(
            f"relative logit error {max_rel:.4f} (prompt {worst.index}) exceeds the {fmt} bound {bounds.max_rel_error}"
        )
    if top1 < bounds.min_top1_agreement:
        failures.append(f"top-1 agreement {top1:.3f} is below the {fmt} bound {bounds.min_top1_agreement}")
    if bounds.require_greedy_equal and not greedy_all:
        bad = [r.index for r in results if not r.greedy_equal]
        failures.append(f"greedy continuations of prompts {bad} differ from transformers")
    return ParityReport(
        hf_dir=str(hf_dir),
        checkpoint_dir=str(ckpt_or_engine_dir),
        format=fmt,
        bounds=bounds,
        prompts=results,
        max_rel_error=max_rel,
        mean_rel_error=sum(r.rel_error for r in results) / len(results),
        top1_agreement=top1,
        greedy_equal_all=greedy_all,
        passed=not failures,
        failures=failures,
    )
