"""Keys change exactly when an input they depend on changes (hypothesis), and never carry paths.

The key documents are the stages' (trtpipe.stages.checkpoint/engine/publish); the store only hashes them."""

from __future__ import annotations

import copy
import hashlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trtpipe import quant
from trtpipe.stages.checkpoint import checkpoint_key
from trtpipe.stages.engine import engine_key
from trtpipe.stages.publish import repository_key
from trtpipe.store import keys

ALGOS = ["none", "fp8", "int4_awq", "w4a8_awq", "int8_sq", "int8_wo", "nvfp4"]
KVS = ["float16", "bfloat16", "fp8", "int8"]
ALL = {"checkpoint", "engine", "repository"}
DOWNSTREAM_OF_ENGINE = {"engine", "repository"}


def all_keys(p: dict[str, Any]) -> dict[str, str]:
    ck = checkpoint_key(
        config_digest=p["config"], weight_digests=p["weights"], dtype=p["dtype"], algo=p["algo"], kv_cache=p["kv"],
        group_size=p["group_size"], calibration_digest=p["calibration"], calibration_samples=p["samples"],
        calibration_max_seq_len=p["calib_len"], calibration_seed=p["seed"], tp=p["tp"], pp=p["pp"],
        modelopt_version=p["modelopt"], transformers_version=p["transformers"],
    )
    ek = engine_key(
        checkpoint=ck.key, build_config=p["build_config"], trtllm_version=p["trtllm"],
        tensorrt_version=p["tensorrt"], gpu_sm=p["sm"], gpu_product=p["product"],
    )
    # The repository key hashes the engine's DIGEST (its bytes). Stand-in: another engine key means
    # other engine bytes here (a rebuild with identical bytes is test_build's business).
    engine_digest = "sha256:" + hashlib.sha256(ek.key.encode()).hexdigest()
    rk = repository_key(engine_digest=engine_digest, serving=p["serving"], tokenizer_digest=p["tokenizer"],
                             templates_digest=p["templates"], trtpipe_version=p["trtpipe"], name=p["name"],
                             target={"gpu": "cpu-reference", "sm": p["sm"]}, toolchain="trtllm-1.2.1",
                             quant=p["algo"], release=p["release"])
    return {"checkpoint": ck.key, "engine": ek.key, "repository": rk.key}


hexes = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)


@st.composite
def params(draw) -> dict[str, Any]:
    return {
        "config": draw(hexes),
        "weights": draw(st.lists(hexes, min_size=1, max_size=4, unique=True)),
        "dtype": draw(st.sampled_from(["float16", "bfloat16"])),
        "algo": draw(st.sampled_from(ALGOS)),
        "kv": draw(st.sampled_from(KVS)),
        "group_size": draw(st.sampled_from([32, 64, 128])),
        "calibration": draw(hexes),
        "samples": draw(st.integers(1, 512)),
        "calib_len": draw(st.integers(8, 4096)),
        "seed": draw(st.integers(0, 2**31)),
        "tp": draw(st.sampled_from([1, 2, 4, 8])),
        "pp": draw(st.sampled_from([1, 2])),
        "modelopt": draw(st.sampled_from(["0.31.0", "0.33", "0.37.0"])),
        "transformers": draw(st.sampled_from(["4.51.3", "4.53.1", "4.57.3"])),
        "build_config": {
            "max_batch_size": draw(st.integers(1, 256)),
            "max_seq_len": draw(st.integers(2, 32768)),
            "plugin_config": {"gemm_plugin": draw(st.sampled_from(["auto", None])), "use_fused_mlp": draw(st.booleans())},
        },
        "trtllm": draw(st.sampled_from(["0.21.0", "1.0.0", "1.2.1"])),
        "tensorrt": draw(st.sampled_from(["10.11.0.33", "10.13.3.9"])),
        "sm": draw(st.sampled_from([None, 80, 89, 90, 100])),
        "product": draw(st.sampled_from(["cpu-reference", "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"])),
        "serving": {"streaming": draw(st.booleans()), "kv_cache_free_gpu_mem_fraction": 0.9},
        "tokenizer": draw(hexes),
        "templates": "sha256:" + draw(hexes),
        "trtpipe": draw(st.sampled_from(["0.1.0", "0.2.0"])),
        "name": draw(st.sampled_from(["tiny-llama", "llama-3-8b-fp8"])),
        "release": {"gates": {"prod": {"smoke": True, "parity": draw(st.booleans())}}},
    }


def _bump_hex(value: str) -> str:
    return ("1" if value[0] != "1" else "2") + value[1:]


def mutate(p: dict[str, Any], what: str) -> tuple[dict[str, Any], set[str]]:
    """Change one input; return the new params and the keys that must change."""
    q = copy.deepcopy(p)
    calibrated = quant.needs_calibration(p["algo"], p["kv"])
    if what == "weight file":
        q["weights"][0] = _bump_hex(q["weights"][0])
        return q, ALL
    if what == "config file":
        q["config"] = _bump_hex(q["config"])
        return q, ALL
    if what == "calibration file":
        q["calibration"] = _bump_hex(q["calibration"])
        return q, ALL if calibrated else set()
    if what == "calibration samples":
        q["samples"] += 1
        return q, ALL if calibrated else set()
    if what == "group size":
        q["group_size"] = 64 if p["group_size"] != 64 else 128
        return q, ALL if quant.FORMATS[p["algo"]].grouped else set()
    if what == "dtype":
        q["dtype"] = "bfloat16" if p["dtype"] == "float16" else "float16"
        return q, ALL
    if what == "tp":
        q["tp"] = p["tp"] * 2
        return q, ALL
    if what == "modelopt version":
        q["modelopt"] = p["modelopt"] + ".post1"
        return q, ALL
    if what == "transformers version":
        q["transformers"] = p["transformers"] + ".post1"
        return q, ALL
    if what == "engine limit":
        q["build_config"]["max_batch_size"] += 1
        return q, DOWNSTREAM_OF_ENGINE
    if what == "plugin":
        q["build_config"]["plugin_config"]["use_fused_mlp"] = not p["build_config"]["plugin_config"]["use_fused_mlp"]
        return q, DOWNSTREAM_OF_ENGINE
    if what == "trtllm version":
        q["trtllm"] = p["trtllm"] + ".post1"
        return q, DOWNSTREAM_OF_ENGINE
    if what == "tensorrt version":
        q["tensorrt"] = p["tensorrt"] + ".1"
        return q, DOWNSTREAM_OF_ENGINE
    if what == "gpu":
        q["sm"], q["product"] = (90, "NVIDIA H200") if p["sm"] != 90 else (80, "NVIDIA A100")
        return q, DOWNSTREAM_OF_ENGINE
    if what == "serving option":
        q["serving"]["streaming"] = not p["serving"]["streaming"]
        return q, {"repository"}
    if what == "tokenizer":
        q["tokenizer"] = _bump_hex(q["tokenizer"])
        return q, {"repository"}
    if what == "serving templates":
        q["templates"] = "sha256:" + _bump_hex(p["templates"].removeprefix("sha256:"))
        return q, {"repository"}
    if what == "trtpipe version":
        q["trtpipe"] = p["trtpipe"] + ".post1"
        return q, {"repository"}
    if what == "name":
        q["name"] = p["name"] + "-v2"
        return q, {"repository"}
    if what == "release gates":
        q["release"]["gates"]["prod"]["parity"] = not p["release"]["gates"]["prod"]["parity"]
        return q, {"repository"}
    raise AssertionError(what)


MUTATIONS = [
    "weight file", "config file", "calibration file", "calibration samples", "group size", "dtype", "tp",
    "modelopt version", "transformers version", "engine limit", "plugin", "trtllm version", "tensorrt version",
    "gpu", "serving option", "tokenizer", "serving templates", "trtpipe version", "name", "release gates",
]  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(params(), st.sampled_from(MUTATIONS))
def test_a_change_moves_exactly_the_keys_that_depend_on_it(p: dict[str, Any], what: str) -> None:
    before = all_keys(p)
    q, expected = mutate(p, what)
    after = all_keys(q)
    changed = {name for name in before if before[name] != after[name]}
    assert changed == expected, what


@settings(max_examples=50, deadline=None)
@given(params(), st.randoms())
def test_keys_ignore_the_order_of_weight_files(p: dict[str, Any], rnd) -> None:
    q = copy.deepcopy(p)
    rnd.shuffle(q["weights"])
    assert all_keys(p) == all_keys(q)


def test_key_document_is_versioned_and_canonical() -> None:
    common = dict(engine_digest="sha256:" + "e" * 64, tokenizer_digest=None, templates_digest="t", trtpipe_version="0.1.0",
                  name="n", target={"gpu": "cpu-reference"}, toolchain="trtllm-1.2.1", quant="none", release={"gates": {}})
    key = repository_key(serving={"b": 1, "a": 2}, **common)
    assert key.inputs["key_schema"] == keys.KEY_SCHEMA and key.inputs["kind"] == "repository"
    again = repository_key(serving={"a": 2, "b": 1}, **common)
    assert key.key == again.key and len(key.key) == 64
    with pytest.raises(ValueError):
        repository_key(serving={}, **{**common, "engine_digest": "an-engine-key"})
    assert keys.canonical_json({"b": 1, "a": [1, "x"]}) == b'{"a":[1,"x"],"b":1}'


def test_non_json_values_are_refused() -> None:
    from pathlib import Path

    with pytest.raises(ValueError):
        keys.canonical_json({"path": Path("/tmp/model")})  # a path can never sneak into a key
    with pytest.raises(ValueError):
        keys.canonical_json({"x": float("nan")})
