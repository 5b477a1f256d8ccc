"""Which way a conversion runs (streaming, layer-wise, ModelOpt's full model), and that the choice never
enters the checkpoint key: the ways write the same bytes (test_streaming.py, test_layerwise.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtpipe.checkpoint.convert import choose_path
from trtpipe.checkpoint.hf_source import inspect_source
from trtpipe.checkpoint.recipes import spec_text
from trtpipe.checkpoint.streaming import load_hf_config
from trtpipe.pipeline import stage_keys
from trtpipe.resolve import resolve
from trtpipe.spec_loader import load_spec
from trtpipe.settings import Settings


def _choice(model: Path, tmp_path: Path, device: str = "cpu", trust_remote_code: bool = False,
            **recipe: object) -> tuple[str, str]:
    spec_path = tmp_path / "spec.yaml"
    text = spec_text(model, **recipe)  # type: ignore[arg-type]
    if trust_remote_code:
        text = text.replace("allow_pickle: false", "allow_pickle: false\n  trust_remote_code: true")
    spec_path.write_text(text)
    spec = resolve(load_spec(spec_path)).spec
    source = inspect_source(model, None)
    return choose_path(spec, source, load_hf_config(source), device)


@pytest.mark.parametrize(
    ("recipe", "device", "path"),
    [
        ({"algo": "none"}, "cpu", "streaming"),
        ({"algo": "none", "tp": 2, "pp": 2}, "cpu", "streaming"),
        ({"algo": "none"}, "cuda", "streaming"),  # nothing is computed: no GPU needed
        ({"algo": "fp8"}, "cpu", "layerwise"),
        ({"algo": "fp8", "kv_cache": "fp8"}, "cpu", "layerwise"),
        ({"algo": "int4_awq", "kv_cache": "fp8", "tp": 2}, "cpu", "layerwise"),
        ({"algo": "w4a8_awq"}, "cpu", "layerwise"),
        ({"algo": "int8_sq"}, "cpu", "layerwise"),
        ({"algo": "fp8"}, "cuda", "modelopt"),  # GPU calibration spreads the whole model over the GPUs
        ({"algo": "fp8", "converter": "modelopt"}, "cpu", "modelopt"),
        ({"algo": "none", "converter": "modelopt"}, "cpu", "modelopt"),
    ],
)
def test_path_per_recipe(tiny_llama_dir: Path, tmp_path: Path, recipe: dict, device: str, path: str) -> None:
    chosen, reason = _choice(tiny_llama_dir, tmp_path, device, **recipe)
    assert chosen == path, reason
    assert reason


def test_remote_code_takes_modelopts_path(tiny_llama_dir: Path, tmp_path: Path) -> None:
    chosen, reason = _choice(tiny_llama_dir, tmp_path, trust_remote_code=True, algo="none")
    assert chosen == "modelopt" and "trust_remote_code" in reason


@pytest.mark.parametrize("algo", ["none", "fp8", "int4_awq"])
def test_converter_is_not_in_the_checkpoint_key(tiny_llama_dir: Path, tmp_path: Path, algo: str) -> None:
    keys = {}
    for converter in ("auto", "modelopt"):
        spec = tmp_path / f"{converter}.yaml"
        spec.write_text(spec_text(tiny_llama_dir, algo=algo, converter=converter))
        keys[converter] = stage_keys(spec, store=tmp_path / "store", settings=Settings.from_env())["checkpoint"]
    assert keys["auto"] == keys["modelopt"]
