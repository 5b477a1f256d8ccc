"""The reference runtime sizes a model from a TensorRT-LLM checkpoint's config.json (and the Triton stub loads
it so). It goes through the same bounds as plan, resolve and convert (trtpipe.config_json, flavour trtllm):
an impossible value is one InvalidInput naming the file, the line and the field, before any rank file is read."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from trtpipe.errors import InvalidInput
from trtpipe.reference.runtime import ReferenceModel


@pytest.mark.parametrize("field, written, needle", [
    ("num_hidden_layers", "1e9", '"num_hidden_layers": 1e9 is a number with a fraction or an exponent'),
    ("hidden_size", '"256"', '"hidden_size": "256" is text'),
    ("head_size", "-64", '"head_size": -64 is below 1'),
    ("vocab_size", "10000000000", '"vocab_size": 10000000000 is beyond'),
])
def test_the_reference_runtime_refuses_an_impossible_checkpoint_config(
    field: str, written: str, needle: str, converted, tmp_path: Path
) -> None:
    checkpoint = tmp_path / "ckpt"
    shutil.copytree(converted("llama"), checkpoint)
    config = json.loads((checkpoint / "config.json").read_text())
    assert field in config  # the exporter writes it: the check reads what a real checkpoint holds
    config[field] = "@@"
    text = json.dumps(config, indent=2).replace('"@@"', written)
    (checkpoint / "config.json").write_text(text)
    with pytest.raises(InvalidInput, match=r"config\.json:\d+: " + needle.replace("(", r"\(").replace("+", r"\+")) as caught:
        ReferenceModel.load(checkpoint)
    assert str(checkpoint / "config.json") in caught.value.one_line()


def test_a_checkpoint_mapping_beyond_any_gpu_count_is_refused(converted, tmp_path: Path) -> None:
    checkpoint = tmp_path / "ckpt"
    shutil.copytree(converted("llama"), checkpoint)
    config = json.loads((checkpoint / "config.json").read_text())
    config["mapping"]["tp_size"] = 10**9
    (checkpoint / "config.json").write_text(json.dumps(config))
    with pytest.raises(InvalidInput, match='"tp_size": 1000000000 is not a whole number from 1 to 512'):
        ReferenceModel.load(checkpoint)
