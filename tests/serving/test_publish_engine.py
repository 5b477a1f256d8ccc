"""Issue 22: `trtpipe publish SPEC --engine DIR` publishes a repository for an engine built outside trtpipe.

Stand-in engines (tests/conftest.py write_standin_engine: config.json shaped like trtllm-build 1.2.1's output for
the spec, dummy rank{N}.engine bytes) go through the real command: the engine is checked against the spec, stored
as an "imported" engine artifact, and published by the publish stage; `trtpipe validate` then judges the result.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from trtpipe.cli import main

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "build_configs" / "examples"
GPU_EXAMPLES = sorted(p.name for p in EXAMPLES.glob("*.yaml") if not p.name.startswith("tiny-cpu"))
ACCEPTANCE = EXAMPLES / "llama3-8b-fp8-h100.yaml"


def _publish(capsys: pytest.CaptureFixture[str], spec: Path, engine: Path, store: Path, *extra: str) -> tuple[int, dict, str]:
    code = main(["publish", str(spec), "--engine", str(engine), "--store", str(store), "--json", *extra])
    out = capsys.readouterr()
    return code, json.loads(out.out), out.err


def test_gpu_examples_are_all_tested() -> None:
    assert len(GPU_EXAMPLES) >= 4 and "llama3-70b-fp8-4xh100.yaml" in GPU_EXAMPLES


def test_acceptance_publish_the_8b_example_then_validate(tmp_path: Path, tiny_llama_dir: Path, standin_engine,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's acceptance, as written: `trtpipe publish build_configs/examples/llama3-8b-fp8-h100.yaml --engine
    <stand-in>`, then `trtpipe validate <repo>` exits 0. The example plans from a config.json only and names no
    tokenizer, so this stand-in keeps the model's tokenizer files beside the engine files, as a hand-made engine
    folder may."""
    engine = standin_engine(ACCEPTANCE, tmp_path / "engine", tokenizer_from=tiny_llama_dir)
    store = tmp_path / "store"
    assert main(["publish", str(ACCEPTANCE), "--engine", str(engine), "--store", str(store)]) == 0
    out = capsys.readouterr()
    repo = Path(next(line for line in out.out.splitlines() if line.startswith("repository: ")).split(": ", 1)[1])
    assert "imported" in out.err and "note: not part of the engine, left out: generation_config.json" in out.err
    assert main(["validate", str(repo)]) == 0
    assert capsys.readouterr().out.strip().endswith(": valid")
    # The tokenizer files went to the tokenizer models, not into the engine.
    assert sorted(p.name for p in (repo / "tensorrt_llm" / "1").iterdir()) == ["config.json", "rank0.engine"]
    assert (repo / "preprocessing" / "tokenizer" / "tokenizer.json").read_bytes() == \
        (tiny_llama_dir / "tokenizer.json").read_bytes()


@pytest.mark.parametrize("example", GPU_EXAMPLES)
def test_every_gpu_example_publishes_with_its_tp_and_validates(example: str, tmp_path: Path, tiny_llama_dir: Path,
                                                               standin_engine,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    from trtpipe.build_record import read_records
    from trtpipe.store.local import Store

    spec = EXAMPLES / example
    engine = standin_engine(spec, tmp_path / "engine")
    store = tmp_path / "store"
    code, outcome, err = _publish(capsys, spec, engine, store, "--tokenizer", str(tiny_llama_dir))
    assert code == 0, err
    assert outcome["status"] == "ok" and outcome["imported_from"] == str(engine.resolve())
    repo = Path(outcome["repository_path"])
    assert main(["validate", str(repo), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["valid"] is True

    manifest = json.loads((repo / "trtpipe.json").read_text())
    world = manifest["engine"]["world_size"]
    spec_tp = {"llama3-70b-fp8-4xh100.yaml": 4}.get(example, 1)
    assert (manifest["engine"]["tp"], world, manifest["reference"]) == (spec_tp, spec_tp, False)
    assert sorted(manifest["engine"]["files"]) == sorted(["config.json", *(f"rank{r}.engine" for r in range(world))])
    for rank in range(world):
        assert (repo / "tensorrt_llm" / "1" / f"rank{rank}.engine").read_bytes() == \
            (engine / f"rank{rank}.engine").read_bytes()
    config = (repo / "tensorrt_llm" / "config.pbtxt").read_text()
    assert f'value: {{ string_value: "{outcome["engine_digest"]}" }}' in config  # the identity, as a built one

    # Stored like a built engine: immutable, content-digested, its key document names the origin and files only.
    opened = Store.open(store)
    (engine_entry,) = [e for e in opened.entries("engine")]
    assert engine_entry.digest == outcome["engine_digest"]
    assert engine_entry.inputs["origin"] == "imported"
    assert set(engine_entry.inputs["files"]) == set(manifest["engine"]["files"])
    assert str(engine) not in json.dumps(engine_entry.inputs)  # no path in the key
    assert not os.access(engine_entry.path / "rank0.engine", os.W_OK) or os.geteuid() == 0
    # The build record says where it came from, and that it was imported, not built.
    (record,) = read_records(store)
    stage = next(s for s in record.stages if s.name == "engine")
    assert stage.outcome == "imported" and stage.facts["imported_from"] == str(engine.resolve())
    assert record.artifacts == {"engine": outcome["engine_digest"], "repository": outcome["repository_digest"]}


def test_the_digest_covers_content_only(tmp_path: Path, tiny_llama_dir: Path, standin_engine,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """The same bytes from another folder, with other times, into another store: the same digests. One byte
    changed: another engine and another repository."""
    first = standin_engine(ACCEPTANCE, tmp_path / "here" / "engine")
    elsewhere = tmp_path / "there" / "deeper" / "folder"
    shutil.copytree(first, elsewhere)
    for path in elsewhere.iterdir():
        os.utime(path, (1_000_000, 1_000_000))
    tok = ["--tokenizer", str(tiny_llama_dir)]
    code, a, _ = _publish(capsys, ACCEPTANCE, first, tmp_path / "store-a", *tok)
    assert code == 0
    code, b, _ = _publish(capsys, ACCEPTANCE, elsewhere, tmp_path / "store-b", *tok)
    assert code == 0
    assert (a["engine_digest"], a["repository_digest"]) == (b["engine_digest"], b["repository_digest"])
    assert a["keys"] == b["keys"]
    # Again into the first store, from the other folder: both stages are hits, nothing is written again.
    code, again, _ = _publish(capsys, ACCEPTANCE, elsewhere, tmp_path / "store-a", *tok)
    assert code == 0 and [s["outcome"] for s in again["stages"]][-2:] == ["hit", "hit"]
    changed = tmp_path / "changed"
    shutil.copytree(first, changed)
    (changed / "rank0.engine").write_bytes((changed / "rank0.engine").read_bytes() + b"!")
    code, c, _ = _publish(capsys, ACCEPTANCE, changed, tmp_path / "store-a", *tok)
    assert code == 0
    assert c["engine_digest"] != a["engine_digest"] and c["repository_digest"] != a["repository_digest"]


REFUSALS = [
    # (what, config.json changes, rank files (None: tp x pp), removed file, field named, words in the line)
    ("wrong version", {"version": "1.1.0"}, None, None, "version",
     "TensorRT-LLM 1.1.0 built this engine, but the spec's toolchain trtllm-1.2.1 is TensorRT-LLM 1.2.1"),
    ("wrong tp", {"pretrained_config__mapping": {"world_size": 2, "tp_size": 2, "pp_size": 1}}, 2, None,
     "pretrained_config.mapping.tp_size", "2, but the spec's target.tp is 1"),
    ("a limit over the spec", {"build_config__max_seq_len": 16384}, None, None, "build_config.max_seq_len",
     "16384 is over the spec's limits.max_seq_len 8192; rebuild with --max_seq_len 8192"),
    ("max_num_tokens over the plan", {"build_config__max_num_tokens": 16384}, None, None,
     "build_config.max_num_tokens", "16384 is over the spec's limits.max_num_tokens 8192"),
    ("wrong pp", {"pretrained_config__mapping": {"world_size": 2, "tp_size": 1, "pp_size": 2}}, 1, None,
     "pretrained_config.mapping.pp_size", "2, but the spec's target.pp is 1"),
    ("paged KV off", {"build_config__kv_cache_type": "CONTINUOUS", "build_config__plugin_config__paged_kv_cache": False},
     None, None, "build_config.kv_cache_type",
     '"CONTINUOUS": the KV cache is not paged, and Triton\'s in-flight batching needs a paged KV cache (rules.yaml '
     "inflight-batching-needs-paged-kv-packed-input-gpt-attention: cpp/tensorrt_llm/batch_manager/"
     "trtGptModelInflightBatching.cpp"),
    ("paged KV off, the older field", {"build_config__kv_cache_type": None,
                                       "build_config__plugin_config__paged_kv_cache": False}, None, None,
     "build_config.plugin_config.paged_kv_cache", "false (and no build_config.kv_cache_type): the KV cache is not paged"),
    ("no GPT attention plugin", {"build_config__plugin_config__gpt_attention_plugin": None}, None, None,
     "build_config.plugin_config.gpt_attention_plugin", "null: the engine has no GPT attention plugin"),
    ("padded input", {"build_config__plugin_config__remove_input_padding": False}, None, None,
     "build_config.plugin_config.remove_input_padding", "false: the engine takes padded input"),
    ("other quantization", {"pretrained_config__quantization": {"quant_algo": None, "kv_cache_quant_algo": "FP8"}},
     None, None, "pretrained_config.quantization.quant_algo",
     "null, but the spec's quantization.algo fp8 is \"FP8\"; quantize the checkpoint as quantization.algo fp8, or "
     "set quantization.algo: none"),
    ("other dtype", {"pretrained_config__dtype": "float16"}, None, None, "pretrained_config.dtype",
     "\"float16\", but the spec's model.dtype resolves to bfloat16"),
    ("no version", {"version": None}, None, None, "version", "missing"),
]


@pytest.mark.parametrize("what, changes, world, removed, field, words", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_each_refusal_is_one_line_naming_file_field_and_fix(what: str, changes: dict, world: int | None,
                                                            removed: str | None, field: str, words: str,
                                                            tmp_path: Path, tiny_llama_dir: Path, standin_engine,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    engine = standin_engine(ACCEPTANCE, tmp_path / "engine", world=world, **changes)
    store = tmp_path / "store"
    code = main(["publish", str(ACCEPTANCE), "--engine", str(engine), "--store", str(store),
                 "--tokenizer", str(tiny_llama_dir)])
    out = capsys.readouterr()
    assert code == 2
    (line,) = out.err.strip().splitlines()[-1:]
    assert [l for l in out.err.splitlines() if l.startswith("error:")] == [line]
    assert line.startswith(f"error: {engine.resolve()}/config.json: {field}: "), line
    assert words in line and "Traceback" not in out.err
    assert not (store / "repository").exists() or not any((store / "repository").iterdir())
    assert not (store / "engine").exists() or not any((store / "engine").iterdir())  # nothing stored
    # --json: the refusal as a JSON object on stdout as well, every problem with its file, field and fix.
    code = main(["publish", str(ACCEPTANCE), "--engine", str(engine), "--store", str(store),
                 "--tokenizer", str(tiny_llama_dir), "--json"])
    out = capsys.readouterr()
    refused = json.loads(out.out)  # the one JSON object on stdout
    assert code == 2 and refused["ok"] is False and refused["exit_code"] == 2
    assert refused["error"]["type"] == "EngineMismatch" and refused["error"]["fields"]["field"] == field
    assert refused["verdicts"][0]["field"] == field and refused["verdicts"][0]["fix"]
    assert refused["error"]["stderr"] == line


def test_a_missing_rank_file_is_named(tmp_path: Path, tiny_llama_dir: Path, standin_engine,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    spec = EXAMPLES / "llama3-70b-fp8-4xh100.yaml"
    engine = standin_engine(spec, tmp_path / "engine")
    (engine / "rank2.engine").unlink()
    (engine / "rank1.engine").write_bytes(b"")
    code = main(["publish", str(spec), "--engine", str(engine), "--store", str(tmp_path / "store"),
                 "--tokenizer", str(tiny_llama_dir)])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2
    assert line.startswith(f"error: {engine.resolve()}/rank1.engine: (file): empty"), line
    assert "(1 more: rank2.engine)" in line


def test_a_rank_beyond_the_world_and_other_files(tmp_path: Path, tiny_llama_dir: Path, standin_engine,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    engine = standin_engine(ACCEPTANCE, tmp_path / "engine", world=2)
    code = main(["publish", str(ACCEPTANCE), "--engine", str(engine), "--store", str(tmp_path / "store"),
                 "--tokenizer", str(tiny_llama_dir)])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and line.startswith(f"error: {engine.resolve()}/rank1.engine: (file): rank 1 is beyond")
    (engine / "rank1.engine").unlink()
    (engine / "model.cache").write_bytes(b"timing cache")
    (engine / "notes").mkdir()
    code, outcome, _ = _publish(capsys, ACCEPTANCE, engine, tmp_path / "store", "--tokenizer", str(tiny_llama_dir))
    assert code == 0
    assert "not part of the engine, left out: model.cache, notes/" in outcome["notes"]
    repo = Path(outcome["repository_path"])
    assert not (repo / "tensorrt_llm" / "1" / "model.cache").exists()


def test_spec_side_refusals(tmp_path: Path, tiny_llama_dir: Path, standin_engine,
                            capsys: pytest.CaptureFixture[str]) -> None:
    engine = standin_engine(ACCEPTANCE, tmp_path / "engine")
    # No tokenizer anywhere: one line, naming the spec field and the option that gives one.
    code = main(["publish", str(ACCEPTANCE), "--engine", str(engine), "--store", str(tmp_path / "store")])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and "model.tokenizer: the spec names no tokenizer" in line
    assert "`trtpipe publish SPEC --engine DIR --tokenizer DIR`" in line
    # A cpu-reference spec builds its own engine.
    cpu = tmp_path / "cpu.yaml"
    cpu.write_text(f"name: tiny\nmodel: {{path: {tiny_llama_dir}}}\ntarget: {{gpu: cpu-reference}}\n")
    code = main(["publish", str(cpu), "--engine", str(engine), "--store", str(tmp_path / "store")])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and line.startswith(f"error: {cpu}:3:") and "target.gpu" in line and "backend is reference" in line
    # No such engine folder.
    code = main(["publish", str(ACCEPTANCE), "--engine", str(tmp_path / "nowhere"), "--store", str(tmp_path / "s")])
    assert code == 2 and "no such engine folder" in capsys.readouterr().err


def test_serve_print_record_and_promote_take_the_imported_repository(tmp_path: Path, tiny_llama_dir: Path,
                                                                      standin_engine,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Stored and digested like a built repository: serve mounts a serving copy of it, smoke/bench --record file
    results under its digest, promote reads its gates and results."""
    import shlex

    from trtpipe.serving.identity import record_target
    from trtpipe.store.local import Store

    engine = standin_engine(ACCEPTANCE, tmp_path / "engine")
    store = tmp_path / "store"
    code, outcome, _ = _publish(capsys, ACCEPTANCE, engine, store, "--tokenizer", str(tiny_llama_dir))
    assert code == 0
    repo, digest = Path(outcome["repository_path"]), outcome["repository_digest"]
    assert main(["serve", str(repo), "--print", "--store", str(store)]) == 0
    printed = shlex.split(capsys.readouterr().out.strip())
    mount = next(a for a in printed if a.endswith(":/trtpipe/repo:ro")).rsplit(":", 2)[0]
    assert f'string_value: "{digest}"' in (Path(mount) / "tensorrt_llm" / "config.pbtxt").read_text()
    assert record_target(repo, Store.open(store)).digest == digest
    assert main(["promote", digest, "--to", "staging", "--store", str(store)]) == 1
    assert f"refused to promote {digest} to staging" in capsys.readouterr().err
    assert main(["promote", digest, "--to", "staging", "--store", str(store), "--force", "--reason", "test"]) == 0
    capsys.readouterr()
    assert main(["channels", "--store", str(store), "--json"]) == 0
    assert digest in capsys.readouterr().out
