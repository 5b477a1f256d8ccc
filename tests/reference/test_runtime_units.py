"""Small, fast checks of runtime pieces that the end-to-end proofs do not isolate."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trtpipe.errors import TrtpipeError
from trtpipe.reference.dequant import unpack_int4
from trtpipe.reference.runtime import ModelConfig, rope_inverse_frequencies

BASE_CONFIG = {
    "architecture": "LlamaForCausalLM",
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_size": 256,
    "head_size": 64,
    "intermediate_size": 512,
    "vocab_size": 512,
    "rotary_base": 500000.0,
}


@pytest.mark.parametrize("kind_key", ["rope_type", "type"])
def test_llama31_rope_scaling_matches_transformers(kind_key):
    """TRT-LLM's rotary_scaling for Llama 3.1 (as ModelOpt 0.37 copies it from HF rope_scaling) gives the
    inverse frequencies transformers uses."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaling = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    hf_config = LlamaConfig(
        hidden_size=256, num_attention_heads=4, head_dim=64, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", **scaling}, max_position_embeddings=2048,
    )
    expected, _ = ROPE_INIT_FUNCTIONS["llama3"](hf_config, "cpu")
    config = ModelConfig.from_checkpoint_config(
        BASE_CONFIG | {"rotary_scaling": {kind_key: "llama3", **scaling}}, source=Path("config.json")
    )
    torch.testing.assert_close(rope_inverse_frequencies(config), expected.to(torch.float32), rtol=1e-6, atol=0)
    plain = ModelConfig.from_checkpoint_config(BASE_CONFIG, source=Path("config.json"))
    assert not torch.allclose(rope_inverse_frequencies(plain), expected.to(torch.float32))


def test_unsupported_architecture_and_quant_are_refused():
    with pytest.raises(TrtpipeError, match="supported: LlamaForCausalLM"):
        ModelConfig.from_checkpoint_config(BASE_CONFIG | {"architecture": "GPTJForCausalLM"}, Path("c.json"))
    with pytest.raises(TrtpipeError, match="quant_algo 'NVFP4'"):
        ModelConfig.from_checkpoint_config(BASE_CONFIG | {"quantization": {"quant_algo": "NVFP4"}}, Path("c.json"))


def test_unpack_int4_nibble_order_and_sign():
    # byte 0x7F: low nibble 0xF = -1 (row 0), high nibble 0x7 = 7 (row 1); byte 0x80: low 0, high -8.
    packed = torch.tensor([[0x7F, -128]], dtype=torch.int8)
    assert unpack_int4(packed).tolist() == [[-1.0, 0.0], [7.0, -8.0]]


def test_runtime_import_stays_light():
    """The Triton Python-backend stub imports the runtime: no transformers or modelopt at import time."""
    code = (
        "import sys, trtpipe.reference.runtime, trtpipe.reference.parity;"
        "heavy = [m for m in ('transformers', 'modelopt') if m in sys.modules];"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
