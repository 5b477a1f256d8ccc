"""Calibration one decoder layer at a time: ModelOpt's quantizers and exporter with one layer in memory.

ModelOpt's full-model path (trtpipe.checkpoint.convert) loads the whole model, calibrates it with
`mtq.quantize(model, config, forward_loop)` and exports it: peak memory about 3x the model's bytes for
FP8 on the CPU. Here the same ModelOpt calls run on one decoder layer at a time:

  1. A skeleton of the HF model is built without weights (accelerate's `init_empty_weights`); only its
     buffers (the rotary table) are real, cast to bfloat16 as the full path's `model.to(bfloat16)` casts
     them. The calibration windows' embeddings are gathered row by row from the safetensors files (the
     table is never loaded). The skeleton's forward runs with the decoder layers replaced by recorders,
     which keep the arguments the model passes to each layer (causal mask, rotary cos/sin, positions),
     exactly as the real forward computes them.
  2. For each layer: its weights are read from the files and cast to the export dtype (kept for the
     tensors no quantizer touches: norms, biases) and to bfloat16 (calibration), as the full path loads
     and casts them; `mtq.quantize(layer, config, forward_loop)` runs ModelOpt's calibration algorithm on
     it, where `forward_loop` feeds the layer the activations the previous layer produced in the same
     calibration pass; the untouched tensors are restored; ModelOpt's exporter turns the layer into its
     per-rank tensors (build_decoder_config, the TP split, merge_qkv, pack_linear_weights,
     postprocess_tensors), written into the rank files at once (trtpipe.checkpoint.rank_file).
  3. The embedding, final norm and head, which no quantizer touches, are streamed from the files
     (trtpipe.checkpoint.streaming); config.json comes from ModelOpt's convert_to_tensorrt_llm_config on
     a shape-only copy of the last rank's model config.

Why the scales are the full model's, bit for bit: ModelOpt's algorithms change quantizer state only between
calls of `forward_loop`, each call a full pass over the calibration data, and every layer's statistics
depend only on the inputs that reach it. FP8 (`max`): one pass, quantizers collecting amax and not
quantizing, so every layer sees the unquantized model's activations. INT4-AWQ (`awq_lite`): a caching pass
(unquantized) and a search pass in which each linear returns its unquantized output but the FP8 KV-cache
quantizers, enabled after the first pass, do quantize K and V: the second pass's activations differ from
the first's from layer 1 on. So the activations are carried per pass: pass j of layer i reads what pass j
of layer i-1 produced (identical passes share their tensors). Same inputs, same arithmetic in the same
order (same shapes, same thread count) give the same bits; tests/checkpoint/test_layerwise.py checks every
file byte for byte against the full-model path.

Memory: one layer's weights (bfloat16 for calibration, the export dtype for the restored tensors, then its
exported tensors), plus the calibration activations: windows x tokens x hidden x 2 bytes per distinct pass,
for the layer's inputs and its outputs at once (reported as `activation_bytes`), plus the per-layer
arguments (rotary cos/sin and the causal mask per window length).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trtpipe.checkpoint import streaming
from trtpipe.checkpoint.calibration import prepare_calibration
from trtpipe.checkpoint.hf_source import HfSource
from trtpipe.checkpoint.rank_file import Layout, safetensors_dtype
from trtpipe.errors import TrtpipeError


class _StopForward(Exception):
    """Raised where the skeleton's forward would reach weights it does not hold."""


def convert_layerwise(resolved: Any, source: HfSource, hf_config: dict[str, Any], out_dir: Path, *,
                      recipe: dict[str, Any], dtype: str,
                      task: Callable[[str, int | None], Callable[[int], None]]) -> dict[str, Any]:
    """Calibrate and export `source` one layer at a time into `out_dir` (rank files and config.json)."""
    import torch
    from transformers import AutoTokenizer

    spec = resolved.spec
    tokenizer = AutoTokenizer.from_pretrained(source.tokenizer_dir, trust_remote_code=False)
    windows, calibration = prepare_calibration(spec, tokenizer)
    torch.manual_seed(spec.quantization.calibration.seed)
    tp, pp = spec.target.tp, spec.target.pp
    export = {"float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]

    weights = streaming.HfWeights(source.weight_files)
    try:
        skeleton, layers = _skeleton(source, export)
        advance = task("preparing calibration inputs", 1)
        hidden, arguments = _first_inputs(skeleton, layers, weights, windows, export)
        advance(1)
        result = _calibrate_and_export(skeleton, layers, weights, source, hf_config, out_dir, recipe=recipe,
                                       hidden=hidden, arguments=arguments, export=export, dtype=dtype, tp=tp, pp=pp,
                                       task=task)
    finally:
        weights.close()
    return {**result, "calibration": calibration, "bytes_read": weights.bytes_read}


# ------------------------------------------------------------------------------------------------ skeleton


def _skeleton(source: HfSource, export: Any) -> tuple[Any, list[Any]]:
    """The HF model without weights (parameters on the meta device), its decoder layers taken out."""
    import torch
    from accelerate import init_empty_weights
    from modelopt.torch.quantization.plugins.huggingface import register_hf_attentions_on_the_fly
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(source.model_dir, trust_remote_code=False)
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=export, attn_implementation="eager")
    model.eval()
    for module in model.modules():  # the full path's model.to(bfloat16) casts the real buffers (rotary table)
        for name, buffer in list(module.named_buffers(recurse=False)):
            if buffer is not None and buffer.is_floating_point():
                module._buffers[name] = buffer.to(torch.bfloat16)
    # ModelOpt adds the KV-cache quantizers to HF attention classes it registers when mtq.quantize is given a
    # PreTrainedModel; the layers quantized here alone need that registration done first.
    register_hf_attentions_on_the_fly(model)
    layers = list(model.model.layers)
    return model, layers


def _recorder_class() -> Any:
    import torch

    class Recorder(torch.nn.Module):
        """Stands in for a decoder layer: keeps the arguments the model passes it, returns its input."""

        def __init__(self, attention_type: str | None) -> None:
            super().__init__()
            self.attention_type = attention_type
            self.calls: list[dict[str, Any]] = []

        def forward(self, hidden_states: Any, **kwargs: Any) -> Any:
            kwargs["past_key_values"] = None  # the full forward's cache starts empty: same values without it
            self.calls.append(kwargs)
            return hidden_states

    return Recorder


def _stop(*_args: Any, **_kwargs: Any) -> Any:
    raise _StopForward


def _first_inputs(skeleton: Any, layers: list[Any], weights: streaming.HfWeights, windows: list[list[int]],
                  export: Any) -> tuple[list[Any], list[list[dict[str, Any]]]]:
    """(the first layer's inputs per window, every layer's other arguments per window)."""
    import torch

    embedded = _embedding_rows(weights, sorted({t for w in windows for t in w}), export)
    recorder = _recorder_class()
    recorders = [recorder(getattr(layer, "attention_type", None)) for layer in layers]
    inner = skeleton.model
    saved_layers = inner.layers
    inner.layers = torch.nn.ModuleList(recorders)
    inner.norm.forward = _stop  # the final norm's weight is not loaded: stop there
    hidden: list[Any] = []
    try:
        with torch.no_grad():
            for window in windows:
                x = torch.stack([embedded[t] for t in window]).unsqueeze(0)
                hidden.append(x)
                try:
                    skeleton(inputs_embeds=x)
                except _StopForward:
                    pass
    finally:
        inner.layers = saved_layers
        del inner.norm.forward
    if any(len(r.calls) != len(windows) for r in recorders):
        raise TrtpipeError("layer-wise calibration: the model's forward did not reach every layer once per window",
                           fix="set quantization.converter: modelopt for this model")
    return hidden, [r.calls for r in recorders]


def _embedding_rows(weights: streaming.HfWeights, ids: list[int], export: Any) -> dict[int, Any]:
    """The calibration tokens' embedding rows in bfloat16 (via the export dtype, as the full path loads and
    casts the table), read from the files in runs of consecutive ids."""
    import torch

    rows: dict[int, Any] = {}
    start = 0
    while start < len(ids):
        stop = start
        while stop + 1 < len(ids) and ids[stop + 1] == ids[stop] + 1:
            stop += 1
        block = weights.rows("model.embed_tokens.weight", ids[start], ids[stop] + 1).to(export).to(torch.bfloat16)
        for offset in range(stop - start + 1):
            rows[ids[start + offset]] = block[offset]
        start = stop + 1
    return rows


# ------------------------------------------------------------------------------------------------ layers


def _load_layer(layer: Any, weights: streaming.HfWeights, index: int, export: Any) -> list[tuple[Any, str, Any]]:
    """Read layer `index` into `layer` in bfloat16, block by block into its final tensors (file dtype -> export
    dtype -> bfloat16, the casts from_pretrained(dtype=export) and .to(bfloat16) make); return the untouched
    tensors (norms, biases) in the export dtype, to restore after calibration."""
    import torch

    prefix = f"model.layers.{index}."
    state, originals = {}, []
    for name in layer.state_dict():
        full = prefix + name
        shape = weights.shape(full)
        value = torch.empty(shape, dtype=torch.bfloat16)
        step = weights.block_rows(full)
        for start in range(0, shape[0], step):
            stop = min(start + step, shape[0])
            block = weights.rows(full, start, stop).to(export)
            if "layernorm" in name or name.endswith(".bias"):  # small: kept whole in the export dtype
                owner, _, attribute = name.rpartition(".")
                originals.append((layer.get_submodule(owner), attribute, block))
            value[start:stop] = block
        state[name] = value
    layer.load_state_dict(state, assign=True, strict=True)
    layer.requires_grad_(False)
    return originals


def _restore(originals: list[tuple[Any, str, Any]]) -> None:
    for module, attribute, value in originals:
        getattr(module, attribute).data = value


def _calibrate_and_export(skeleton: Any, layers: list[Any], weights: streaming.HfWeights, source: HfSource,
                          hf_config: dict[str, Any], out_dir: Path, *, recipe: dict[str, Any], hidden: list[Any],
                          arguments: list[list[dict[str, Any]]], export: Any, dtype: str, tp: int, pp: int,
                          task: Callable[[str, int | None], Callable[[int], None]]) -> dict[str, Any]:
    import contextlib

    import modelopt.torch.quantization as mtq
    import torch

    meta_config = skeleton.config.__dict__
    meta_config["training_pipeline_parallel"] = 1  # what torch_to_tensorrt_llm_checkpoint sets on one process
    meta_config["training_tensor_parallel"] = 1
    passes: list[list[Any]] = [hidden]  # the activations entering the current layer, per calibration pass
    activation_peak = 0
    last_rank_layers: list[Any] = []
    quantization = None
    g = streaming.geometry(source, tp, pp)
    advance = task("calibrating and exporting layers", g.layers)
    with contextlib.ExitStack() as stack:
        writers: dict[int, Any] | None = None
        for index in range(len(layers)):
            layer = layers[index]
            # Neither list keeps a reference: the layer is freed once exported.
            layers[index] = None
            skeleton.model.layers[index] = torch.nn.Identity()
            originals = _load_layer(layer, weights, index, export)
            produced: list[list[Any]] = []

            def forward_loop(module: Any, index: int = index, produced: list[list[Any]] = produced) -> None:
                inputs = passes[min(len(produced), len(passes) - 1)]
                outputs = []
                with torch.no_grad():
                    for window, x in enumerate(inputs):
                        out = module(x, **arguments[index][window])
                        outputs.append(out[0] if isinstance(out, tuple) else out)
                produced.append(outputs)

            mtq.quantize(layer, copy.deepcopy(recipe), forward_loop)
            if not produced:
                raise TrtpipeError("layer-wise calibration: the quantization algorithm ran no calibration pass",
                                   fix="set quantization.converter: modelopt for this format")
            _restore(originals)
            del originals
            activation_peak = max(activation_peak, _distinct_bytes(passes + produced))
            passes = _dedupe(produced)

            with torch.no_grad():  # no autograd graph may keep a layer's weights alive behind its export
                quantization, rank_tensors, layer_configs = _export_layer(layer, meta_config, tp, export)
            del layer
            pp_rank, local = streaming.stage_of(g, index)
            if writers is None:
                g = streaming.geometry(source, tp, pp, vocab=_vocab_size(skeleton, quantization))
                writers = stack.enter_context(streaming.rank_writers(out_dir, _layouts(g, dtype, rank_tensors)))
            for tp_rank, tensors in enumerate(rank_tensors):
                writer = writers[streaming.rank_of(g, tp_rank, pp_rank)]
                for name, tensor in tensors.items():
                    writer.write(name.replace("transformer.layers.0.", f"transformer.layers.{local}.", 1), tensor)
            if pp_rank == pp - 1:
                last_rank_layers.append(layer_configs[-1])
            del rank_tensors
            advance(1)
        assert writers is not None
        tied = bool(hf_config.get("tie_word_embeddings", False))
        streaming.write_edges(weights, streaming.TensorSink(writers, dtype), g, tied=tied,
                              which=("embedding", "ln_f", "lm_head"))
    config = _trtllm_config(skeleton, last_rank_layers, quantization, g, dtype, tp, pp)
    (out_dir / "config.json").write_text(json.dumps(config, indent=4), encoding="utf-8")
    return {"activation_bytes": activation_peak}


def _distinct_bytes(tensor_lists: list[list[Any]]) -> int:
    seen: dict[int, int] = {}
    for tensors in tensor_lists:
        for t in tensors:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def _dedupe(produced: list[list[Any]]) -> list[list[Any]]:
    """Passes whose outputs are equal to the previous pass's share its tensors (frees the copy)."""
    import torch

    for j in range(1, len(produced)):
        if all(torch.equal(a, b) for a, b in zip(produced[j], produced[j - 1], strict=True)):
            produced[j] = produced[j - 1]
    return produced


def _vocab_size(skeleton: Any, quantization: str | None) -> int:
    """The vocabulary the checkpoint holds: ModelOpt pads the embedding and head to a multiple of 64 for AWQ
    formats (model_config_export.py, pad_embedding_lm_head)."""
    from modelopt.torch.export.model_config import QUANTIZATION_INT4_AWQ, QUANTIZATION_W4A8_AWQ

    vocab = int(skeleton.config.vocab_size)
    if quantization in (QUANTIZATION_INT4_AWQ, QUANTIZATION_W4A8_AWQ) and vocab % 64:
        vocab = -(-vocab // 64) * 64
    return vocab


def _export_layer(layer: Any, meta_config: dict[str, Any], tp: int, export: Any) -> tuple[Any, list[dict[str, Any]], list[Any]]:
    """ModelOpt's export of one decoder layer: (its quantization format, per-TP-rank tensors named as layer 0,
    per-rank shape-only layer configs). The layer's weights are released as they are packed."""
    from modelopt.torch.export.layer_utils import build_decoder_config
    from modelopt.torch.export.model_config import ModelConfig
    from modelopt.torch.export.model_config_utils import (
        merge_gate_fc,
        merge_qkv,
        model_config_to_dict,
        split_config_and_weights,
    )
    from modelopt.torch.export.postprocess import _split_model_config_for_tp, postprocess_tensors
    from modelopt.torch.export.quant_utils import get_quantization_format

    quantization = get_quantization_format(layer)
    config = ModelConfig(quantization=quantization, layers=[build_decoder_config(layer, meta_config, "llama", tp_size=tp)])
    layer.to("meta")  # the config holds what export needs; the module's own references go
    per_rank = _split_model_config_for_tp(config, tp) if tp > 1 else [config]
    del config
    tensors, shapes = [], []
    for rank_config in per_rank:
        merge_qkv(rank_config)
        merge_gate_fc(rank_config)
        _pack_linear_weights(rank_config)
        shapes.append(_shape_only(rank_config.layers[0]))
        named: dict[str, Any] = {}
        layer_facts: dict[str, Any] = {}
        split_config_and_weights(model_config_to_dict(rank_config), named, "transformer", layer_facts)
        postprocess_tensors(named, dtype=export, force_cpu=True, force_contiguous=True, force_non_view=False)
        tensors.append(named)
    return quantization, tensors, shapes


PACK_CHUNK_BYTES = 16 << 20  # float32 bytes of weight quantized at once


def _pack_linear_weights(model_config: Any) -> None:
    """ModelOpt's pack_linear_weights (model_config_utils.py), on the CPU, in row chunks.

    pack_linear_weights quantizes each linear's whole weight at once through ModelOpt's to_quantized_weight,
    whose float32 intermediates are 2-4x the bf16 weight (an 8B MLP weight: 235 MB each). The same function
    is called here on row blocks (an even number of rows: INT4 packs rows 2k and 2k+1 into one byte row) with
    the matching rows of per-row and per-group scales; every operation in it is elementwise or within a row
    pair, so the result is the same, byte for byte (tests/checkpoint/test_layerwise.py), and each packed
    weight replaces its bf16 source at once, which then goes."""
    import dataclasses

    import torch
    from modelopt.torch.export.model_config import (
        QUANTIZATION_FP8_PC_PT,
        QUANTIZATION_INT4_AWQ,
        QUANTIZATION_W4A8_AWQ,
        LinearConfig,
    )
    from modelopt.torch.export.quant_utils import to_quantized_weight

    if not model_config.quantization:
        return

    def linears(value: Any) -> list[Any]:
        if isinstance(value, LinearConfig):
            return [value]
        if isinstance(value, list):
            return [found for item in value for found in linears(item)]
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return [found for f in dataclasses.fields(value) for found in linears(getattr(value, f.name))]
        return []

    for linear in linears(model_config):
        if linear.weights_scaling_factor is None or linear.quantization is None:
            continue
        if linear.quantization == QUANTIZATION_FP8_PC_PT:
            raise TrtpipeError("layer-wise export met an FP8 per-channel layer", fix="set quantization.converter: modelopt")
        weight, scale = linear.weight, linear.weights_scaling_factor
        if weight.element_size() > 1:
            rows = weight.shape[0]
            step = max(2, PACK_CHUNK_BYTES // (4 * weight.shape[1]) // 2 * 2)
            per_row = scale.numel() > 1 and scale.shape[0] == rows
            packed = None
            for start in range(0, rows, step):
                stop = min(start + step, rows)
                part = to_quantized_weight(weight[start:stop], scale[start:stop] if per_row else scale,
                                           linear.quantization, linear.weights_scaling_factor_2, linear.awq_block_size)
                if packed is None:
                    ratio = part.shape[0] / (stop - start)
                    packed = torch.empty((int(rows * ratio),) + tuple(part.shape[1:]), dtype=part.dtype)
                packed[int(start * ratio) : int(start * ratio) + part.shape[0]] = part
            linear.weight = packed
            del weight
        if linear.quantization in (QUANTIZATION_INT4_AWQ, QUANTIZATION_W4A8_AWQ):
            linear.weight = linear.weight.view(torch.int8)
        linear.weights_scaling_factor = linear.weights_scaling_factor.cpu()


def _shape_only(value: Any) -> Any:
    """A copy of a ModelOpt config with every tensor replaced by a meta tensor of its shape and dtype: what
    convert_to_tensorrt_llm_config reads (shapes, presence), without the data."""
    import dataclasses

    import torch

    if isinstance(value, torch.Tensor):
        return torch.empty(value.shape, dtype=value.dtype, device="meta")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        clone = copy.copy(value)
        for f in dataclasses.fields(value):
            object.__setattr__(clone, f.name, _shape_only(getattr(value, f.name)))
        return clone
    if isinstance(value, list):
        return [_shape_only(v) for v in value]
    if isinstance(value, dict):
        return {k: _shape_only(v) for k, v in value.items()}
    return value


def _layouts(g: Any, dtype: str, layer_tensors: list[dict[str, Any]]) -> dict[int, Layout]:
    """Every rank's file layout: the edges' shapes (unquantized) and, per layer, the tensors ModelOpt wrote for
    the first layer on that TP rank (the layers of a llama-layout model are alike; the writer refuses any
    layer that is not)."""
    st = {"float16": "F16", "bfloat16": "BF16"}[dtype]
    per_stage = g.layers // g.pp
    layouts = {}
    for pp_rank in range(g.pp):
        for tp_rank in range(g.tp):
            entries = {name: (st, shape) for name, shape in streaming.edge_tensor_shapes(g, pp_rank).items()}
            for local in range(per_stage):
                for name, tensor in layer_tensors[tp_rank].items():
                    renamed = name.replace("transformer.layers.0.", f"transformer.layers.{local}.", 1)
                    entries[renamed] = (safetensors_dtype(tensor), tuple(tensor.shape))
            layouts[streaming.rank_of(g, tp_rank, pp_rank)] = Layout(entries)
    return layouts


def _trtllm_config(skeleton: Any, last_rank_layers: list[Any], quantization: Any,
                   g: Any, dtype: str, tp: int, pp: int) -> dict[str, Any]:
    """config.json as ModelOpt's export writes it for the last rank (export_tensorrt_llm_checkpoint), from a
    shape-only model config of that rank."""
    from modelopt.torch.export.layer_utils import build_embedding_config, build_layernorm_config, build_linear_config
    from modelopt.torch.export.model_config import LINEAR_COLUMN, ModelConfig
    from modelopt.torch.export.model_config_utils import model_config_to_dict, split_config_and_weights
    from modelopt.torch.export.quant_utils import process_layer_quant_config
    from modelopt.torch.export.tensorrt_llm_utils import convert_to_tensorrt_llm_config

    inner = skeleton.model
    model_config = ModelConfig(
        architecture=skeleton.config.architectures[0],
        quantization=quantization,
        dtype=dtype,
        vocab_size=g.vocab,
        rank=tp * pp - 1,
        tensor_parallel=tp,
        pipeline_parallel=pp,
        vocab_embedding=_shape_only(build_embedding_config(inner.embed_tokens)) if pp == 1 else None,
        layers=last_rank_layers,
        ln_f=_shape_only(build_layernorm_config(inner.norm)),
        lm_head=_shape_only(build_linear_config(skeleton.lm_head, LINEAR_COLUMN)),
    )
    facts: dict[str, Any] = {}
    split_config_and_weights(model_config_to_dict(model_config), {}, "transformer", facts)
    quant_config = process_layer_quant_config(facts)
    config = convert_to_tensorrt_llm_config(model_config, quant_config, hf_config=None)
    # export_tensorrt_llm_checkpoint: per-layer formats go to quant_cfg.json, else the excluded modules
    # are listed (the exclusions of the rank that writes config.json, the last).
    if "quantized_layers" in quant_config:
        raise TrtpipeError("layer-wise calibration produced mixed per-layer formats",
                           fix="set quantization.converter: modelopt for this model")
    config["quantization"]["exclude_modules"] = list(set(config["quantization"].get("exclude_modules") or []))
    return config
