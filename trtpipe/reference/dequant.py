"""Dequantization of the linear layers in a TensorRT-LLM checkpoint, as ModelOpt 0.37 writes them.

Layouts (verified by exporting a tiny Llama with ModelOpt 0.37.0 on this machine and reading the tensors):

- unquantized: `weight` [out, in] in the checkpoint dtype.
- FP8 (`quant_algo: FP8`): `weight` float8_e4m3fn [out, in], `weights_scaling_factor` f32 [1],
  `activation_scaling_factor` f32 [1]. W = fp8 upcast × weights_scaling_factor.
- INT4 AWQ (`W4A16_AWQ`): `weight` int8 [out/2, in]; byte (k, j) holds output row 2k in its low nibble and
  row 2k+1 in its high nibble, each a signed two's-complement int4, no zero point. `weights_scaling_factor`
  f32 [out, in/group]; `prequant_scaling_factor` f16 [in] multiplies the activations before the GEMM.
  W = int4 × scale of its group.
- W4A8 AWQ (`W4A8_AWQ`): as INT4 AWQ (the per-group scale already holds the full factor: ModelOpt packs with
  it alone), plus `weights_scaling_factor_2` f32 [1] (the per-tensor FP8 scale TRT-LLM folds into its kernel's
  alpha) and `activation_scaling_factor` f32 [1] for the FP8 activations.
- INT8 SmoothQuant (`W8A8_SQ_PER_CHANNEL`): `weight` int8 [out, in], `weights_scaling_factor` f32 [out],
  `activation_scaling_factor` f32 [1] (per-tensor int8 activations), `prequant_scaling_factor` [in].
- INT8 weight-only (`W8A16`): `weight` int8 [out, in], `weights_scaling_factor` [out].

Which layout and which activation quantization a checkpoint's `quant_algo` has is its row in the
quantization table (trtpipe.quant: `dequant`, `activation_quant`); this module implements each kind.

Activations: by default the runtime also simulates the activation quantization the engine performs
(FP8 for FP8/W4A8, per-tensor INT8 for SmoothQuant) with the checkpoint's static `activation_scaling_factor`,
so a bad activation scale shows up in parity just as it would on the GPU. Pass
`simulate_activation_quant=False` to `ReferenceModel.load` for plain dequantized-weight math.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trtpipe import quant
from trtpipe.errors import IntegrityError

FP8_MAX = 448.0  # largest finite float8_e4m3fn value
INT8_MAX = 127.0

# quant_algo values (TRT-LLM QuantAlgo names) this runtime can dequantize: the table's formats with a `dequant`.
SUPPORTED_QUANT_ALGOS = tuple(f.checkpoint_algo for f in quant.FORMATS.values() if f.dequant is not None)


def _dequant_kind(quant_algo: str | None) -> str | None:
    fmt = quant.by_checkpoint_algo(quant_algo)
    return fmt.dequant if fmt is not None else None


def _scale_name(quant_algo: str | None) -> str:
    fmt = quant.by_checkpoint_algo(quant_algo)
    return fmt.weight_scale if fmt is not None else "weights_scaling_factor"


@dataclass(frozen=True)
class ActivationQuant:
    """Static per-tensor activation quantization applied by the engine before a GEMM."""

    kind: str  # "fp8" or "int8"
    scale: float

    def fake_quantize(self, x: torch.Tensor) -> torch.Tensor:
        """Quantize then dequantize `x` (float32), saturating like the engine does."""
        if self.kind == "fp8":
            scaled = (x / self.scale).clamp(-FP8_MAX, FP8_MAX)
            return scaled.to(torch.float8_e4m3fn).to(torch.float32) * self.scale
        scaled = torch.round(x / self.scale).clamp(-INT8_MAX - 1, INT8_MAX)
        return scaled * self.scale


@dataclass
class Linear:
    """One dequantized linear layer: y = fake_quant(x * prequant_scale) @ weight.T + bias, all float32."""

    weight: torch.Tensor  # [out, in] float32, dequantized
    bias: torch.Tensor | None = None  # [out]
    prequant_scale: torch.Tensor | None = None  # [in], multiplies the activations (AWQ, SmoothQuant)
    activation_quant: ActivationQuant | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.prequant_scale is not None:
            x = x * self.prequant_scale
        if self.activation_quant is not None:
            x = self.activation_quant.fake_quantize(x)
        y = x @ self.weight.T
        if self.bias is not None:
            y = y + self.bias
        return y

    def effective_weight(self) -> torch.Tensor:
        """The [out, in] weight this layer applies to its raw input (pre-quant scale folded in)."""
        if self.prequant_scale is None:
            return self.weight
        return self.weight * self.prequant_scale[None, :]


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """int8 [out/2, in] (row 2k low nibble, row 2k+1 high nibble) -> int values [out, in] in -8..7 (float32)."""
    as_int = packed.to(torch.int16) & 0xFF
    low = as_int & 0x0F
    high = (as_int >> 4) & 0x0F
    low = torch.where(low >= 8, low - 16, low)
    high = torch.where(high >= 8, high - 16, high)
    rows_half, cols = packed.shape
    # Interleave: row 2k from the low nibble of byte row k, row 2k+1 from its high nibble.
    out = torch.stack((low, high), dim=1).reshape(rows_half * 2, cols)
    return out.to(torch.float32)


def _require(tensors: dict[str, torch.Tensor], prefix: str, name: str) -> torch.Tensor:
    key = f"{prefix}.{name}"
    if key not in tensors:
        raise IntegrityError(
            f"checkpoint tensor {key} is missing",
            fix="re-export the checkpoint; its quantization config and its tensors disagree",
        )
    return tensors[key]


def _scalar(t: torch.Tensor) -> float:
    return float(t.to(torch.float32).reshape(-1)[0])


def dequantize_weight(tensors: dict[str, torch.Tensor], prefix: str, quant_algo: str | None) -> torch.Tensor:
    """The float32 [out, in] weight of linear `prefix` (e.g. transformer.layers.0.attention.qkv)."""
    weight = _require(tensors, prefix, "weight")
    if weight.dtype == torch.float8_e4m3fn:
        scale = _require(tensors, prefix, _scale_name(quant_algo)).to(torch.float32).reshape(-1)
        if scale.numel() not in (1, weight.shape[0]):
            raise IntegrityError(
                f"checkpoint tensor {prefix}.{_scale_name(quant_algo)} has {scale.numel()} values; expected one per "
                f"tensor or one per output channel ({weight.shape[0]})", fix="re-export the checkpoint")
        # CPU torch cannot do arithmetic on float8: upcast first. One scale per tensor, or per output row.
        return weight.to(torch.float32) * (scale if scale.numel() == 1 else scale.reshape(-1, 1))
    if weight.dtype in (torch.float16, torch.bfloat16, torch.float32):
        return weight.to(torch.float32)
    if weight.dtype != torch.int8:
        raise IntegrityError(f"checkpoint tensor {prefix}.weight has unsupported dtype {weight.dtype}",
                             fix="re-export the checkpoint")
    scale = _require(tensors, prefix, _scale_name(quant_algo)).to(torch.float32)
    kind = _dequant_kind(quant_algo)
    if kind == "int4-grouped":
        values = unpack_int4(weight)
        out_dim, in_dim = values.shape
        if scale.dim() != 2 or scale.shape[0] != out_dim or in_dim % scale.shape[1] != 0:
            raise IntegrityError(
                f"checkpoint tensor {prefix}.weights_scaling_factor has shape {tuple(scale.shape)}; "
                f"expected [{out_dim}, {in_dim}/group_size] for {quant_algo}", fix="re-export the checkpoint",
            )
        group = in_dim // scale.shape[1]
        return values * scale.repeat_interleave(group, dim=1)
    if kind == "int8-per-channel":
        out_dim = weight.shape[0]
        if scale.numel() != out_dim:
            raise IntegrityError(
                f"checkpoint tensor {prefix}.weights_scaling_factor has {scale.numel()} values; "
                f"expected one per output channel ({out_dim}) for {quant_algo}", fix="re-export the checkpoint",
            )
        return weight.to(torch.float32) * scale.reshape(out_dim, 1)
    int8_algos = [f.checkpoint_algo for f in quant.FORMATS.values() if f.dequant in ("int4-grouped", "int8-per-channel")]
    raise IntegrityError(
        f"checkpoint tensor {prefix}.weight is int8 but quant_algo is {quant_algo!r}",
        fix=f"the reference runtime dequantizes int8 weights for {', '.join(map(str, int8_algos))}",
    )


def activation_quant_for(
    tensors: dict[str, torch.Tensor], prefix: str, quant_algo: str | None
) -> ActivationQuant | None:
    """The activation quantization the engine applies before linear `prefix`, if any."""
    key = f"{prefix}.activation_scaling_factor"
    fmt = quant.by_checkpoint_algo(quant_algo)
    kind = fmt.activation_quant if fmt is not None else None
    if key not in tensors or kind is None:
        return None
    if fmt is not None and fmt.dequant == "fp8" and tensors[f"{prefix}.weight"].dtype != torch.float8_e4m3fn:
        return None  # an excluded (unquantized) layer inside an FP8 checkpoint
    return ActivationQuant(kind=kind, scale=_scalar(tensors[key]))


def load_linear(
    tensors: dict[str, torch.Tensor],
    prefix: str,
    quant_algo: str | None,
    *,
    simulate_activation_quant: bool,
) -> Linear:
    """Build the dequantized `Linear` for one rank's tensors of linear `prefix`."""
    bias = tensors.get(f"{prefix}.bias")
    pqs = tensors.get(f"{prefix}.prequant_scaling_factor")
    return Linear(
        weight=dequantize_weight(tensors, prefix, quant_algo),
        bias=None if bias is None else bias.to(torch.float32),
        prequant_scale=None if pqs is None else pqs.to(torch.float32),
        activation_quant=activation_quant_for(tensors, prefix, quant_algo) if simulate_activation_quant else None,
    )


def fp8_kv_roundtrip(x: torch.Tensor, scale: float) -> torch.Tensor:
    """Store `x` in an FP8 KV cache with `kv_cache_scaling_factor` and read it back (float32)."""
    return (x / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).to(torch.float32) * scale
