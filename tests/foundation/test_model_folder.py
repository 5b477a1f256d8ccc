"""Model folders are a boundary, and a tokenizer that does not load is refused at build (issue 14).

Reproduced the way the issue found it: `tokenizer.json` symlinked to /etc/passwd in a model folder was copied
into the published (and pushable) repository and `validate` called it valid; weights symlinked outside the
folder were read; an empty or malformed tokenizer.json passed build and validate and failed only when the
server started ("failed to load all models"). Each is now one line naming the file, exit 2, and nothing is
published. The Hugging Face cache's own links (snapshots/<rev>/* -> ../../blobs/<sha>) keep working.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trtpipe.errors import InvalidInput
from trtpipe.model_folder import check_tokenizer, copy_confined, folder_roots

LIMITS = "engine: {max_batch_size: 4, max_input_len: 64, max_seq_len: 128}\n"


@pytest.fixture
def model(tiny_llama_dir: Path, tmp_path: Path) -> Path:
    """A private copy of the tiny model folder (tests plant links in it)."""
    folder = tmp_path / "models" / "tiny"
    shutil.copytree(tiny_llama_dir, folder)
    return folder


def spec_for(tmp_path: Path, folder: Path, extra_model: str = "", extra: str = "") -> Path:
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"name: tiny\nmodel:\n  path: {folder}\n  dtype: float16\n{extra_model}target:\n  gpu: cpu-reference\n"
                    f"{LIMITS}{extra}")
    return spec


def one_error(result) -> str:
    assert "Traceback" not in result.err + result.out
    lines = [x for x in result.err.splitlines() if x.strip()]
    assert len(lines) == 1, result.err
    return lines[0]


def stored(store: Path, kind: str) -> list[Path]:
    folder = store / kind
    return sorted(p for p in folder.iterdir() if not p.name.startswith(".")) if folder.is_dir() else []


def test_a_tokenizer_linked_to_etc_passwd_is_refused_and_nothing_is_published(cli, model: Path, tmp_path: Path) -> None:
    (model / "tokenizer.json").unlink()
    os.symlink("/etc/passwd", model / "tokenizer.json")
    spec = spec_for(tmp_path, model)
    store = tmp_path / "store"
    result = cli("build", spec, "--store", store)
    assert result.code == 2
    line = one_error(result)
    assert f"{spec}:3:" in line and f"{model / 'tokenizer.json'} resolves to /etc/passwd, outside the model folder" in line
    assert "model.allow_external_links: true" in line
    assert stored(store, "checkpoint") == [] and stored(store, "repository") == []
    # a build with --weights checks the same before anything runs
    assert cli("spec-check", "--weights", spec).code == 2


def test_allowing_external_links_still_never_publishes_a_file_that_is_no_tokenizer(cli, model: Path, tmp_path: Path) -> None:
    """With the escape hatch on, /etc/passwd is read as a tokenizer - and refused because it does not load."""
    (model / "tokenizer.json").unlink()
    os.symlink("/etc/passwd", model / "tokenizer.json")
    spec = spec_for(tmp_path, model, "  allow_external_links: true\n")
    result = cli("build", spec, "--store", tmp_path / "store")
    assert result.code == 2
    assert "tokenizer.json does not load with the tokenizers library" in one_error(result)
    assert stored(tmp_path / "store", "repository") == []


@pytest.mark.timeout(600)
def test_weights_linked_outside_are_refused_unless_the_spec_allows_it(cli, model: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere" / "model.safetensors"
    outside.parent.mkdir()
    shutil.move(model / "model.safetensors", outside)
    os.symlink(outside, model / "model.safetensors")
    spec = spec_for(tmp_path, model)
    result = cli("build", spec, "--store", tmp_path / "store")
    assert result.code == 2
    assert f"{model / 'model.safetensors'} resolves to {outside}, outside the model folder" in one_error(result)
    assert stored(tmp_path / "store", "checkpoint") == []
    # the spec's escape hatch: the same folder builds, and the repository holds plain files only
    spec = spec_for(tmp_path, model, "  allow_external_links: true\n")
    result = cli("build", spec, "--store", tmp_path / "store", "--json")
    assert result.code == 0, result.err
    repository = Path(result.json()["repository_path"])
    assert not [p for p in repository.rglob("*") if p.is_symlink()]


def test_a_weight_index_naming_a_shard_outside_the_folder(cli, model: Path, tmp_path: Path) -> None:
    """transformers joins an index's shard names to the folder: '../x.safetensors' would read outside it."""
    index = {"metadata": {}, "weight_map": {"model.embed_tokens.weight": "../../stolen.safetensors"}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    result = cli("spec-check", "--weights", spec_for(tmp_path, model))
    assert result.code == 2
    assert "names the shard '../../stolen.safetensors', which is not a file name inside the folder" in one_error(result)


def test_a_calibration_file_in_the_model_folder_linked_out(cli, model: Path, tmp_path: Path) -> None:
    """In a subfolder (the top-level scan does not reach it): the dataset's own check names the spec field."""
    secret = tmp_path / "secret.txt"
    secret.write_text("not for calibration\n")
    (model / "data").mkdir()
    os.symlink(secret, model / "data" / "calibration.txt")
    spec = spec_for(tmp_path, model, extra=f"quantization:\n  algo: fp8\n  calibration:\n"
                                           f"    dataset: {model}/data/calibration.txt\n")
    result = cli("spec-check", "--weights", spec)
    assert result.code == 2
    line = one_error(result)
    assert f"{spec}:11:" in line and "quantization.calibration.dataset" in line and "outside it" in line
    # a calibration file the spec names outside the model folder is the spec's own choice
    spec.write_text(spec.read_text().replace(f"{model}/data/calibration.txt", str(secret)))
    assert cli("spec-check", "--weights", spec).code == 0


def test_a_separate_tokenizer_folder_is_a_boundary_too(cli, model: Path, tmp_path: Path) -> None:
    tok = tmp_path / "tok"
    tok.mkdir()
    shutil.copy(model / "tokenizer.json", tok / "tokenizer.json")
    os.symlink("/etc/hostname", tok / "tokenizer_config.json")
    spec = spec_for(tmp_path, model, f"  tokenizer: {tok}\n")
    result = cli("spec-check", "--weights", spec)
    assert result.code == 2
    line = one_error(result)
    assert f"{spec}:5:" in line and "model.tokenizer" in line and "outside the tokenizer folder" in line


@pytest.mark.parametrize("content, needle", [
    ("", "tokenizer.json is empty"),
    ('{"version": "1.0", "model": {"type": "BPE"}}', "does not load with the tokenizers library (Missing vocab"),
    ("{not json", "does not load with the tokenizers library"),
])
def test_a_tokenizer_that_does_not_load_is_refused_at_build(content: str, needle: str, cli, model: Path, tmp_path: Path) -> None:
    (model / "tokenizer.json").write_text(content)
    spec = spec_for(tmp_path, model)
    result = cli("build", spec, "--store", tmp_path / "store")
    assert result.code == 2
    line = one_error(result)
    assert f"{spec}:3:" in line and f"{model / 'tokenizer.json'}" in line and needle in line, line
    assert stored(tmp_path / "store", "checkpoint") == []


def test_an_end_token_the_serving_models_cannot_find(cli, model: Path, tmp_path: Path) -> None:
    """The preprocessing model raises at load when no end token is known; so does the build now."""
    (model / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<no-such-token>"}))
    (model / "generation_config.json").write_text(json.dumps({"bos_token_id": 0}))
    result = cli("spec-check", "--weights", spec_for(tmp_path, model))
    assert result.code == 2 and "cannot tell the end token" in one_error(result)


@pytest.mark.timeout(600)
def test_validate_refuses_a_repository_whose_tokenizer_links_out_or_does_not_load(
    cli, model: Path, tmp_path: Path
) -> None:
    result = cli("build", spec_for(tmp_path, model), "--store", tmp_path / "store", "--json")
    assert result.code == 0, result.err
    published = Path(result.json()["repository_path"])
    # the published repository holds only plain copies that passed the check
    for tok in published.glob("*/tokenizer/*"):
        assert not tok.is_symlink() and tok.read_bytes() == (model / tok.name).read_bytes()
    repo = tmp_path / "repo"
    shutil.copytree(published, repo)
    for path in repo.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    assert cli("validate", repo).code == 0
    for name in ("preprocessing", "postprocessing", "tensorrt_llm_bls"):
        target = repo / name / "tokenizer" / "tokenizer.json"
        target.unlink()
        os.symlink("/etc/passwd", target)
    result = cli("validate", repo, "--json")
    assert result.code == 1
    problems = [i for i in result.json()["issues"] if i["field"] == "tokenizer/tokenizer.json"]
    assert len(problems) == 3 and all("resolves to /etc/passwd, outside the repository" in i["message"] for i in problems)
    for name in ("preprocessing", "postprocessing", "tensorrt_llm_bls"):
        target = repo / name / "tokenizer" / "tokenizer.json"
        target.unlink()
        target.write_text("")
    result = cli("validate", repo, "--json")
    assert result.code == 1
    problems = [i for i in result.json()["issues"] if i["field"] == "tokenizer/tokenizer.json"]
    assert len(problems) == 3 and all("the tokenizer does not load" in i["message"] and "is empty" in i["message"]
                                      for i in problems)


def test_publish_copies_only_files_that_still_resolve_inside(model: Path, tmp_path: Path) -> None:
    """A link swapped in after resolve checked the folder is caught where the repository copies it."""
    from trtpipe.serving.inflight_repository import copy_tokenizer

    (model / "special_tokens_map.json").unlink()
    os.symlink("/etc/passwd", model / "special_tokens_map.json")
    with pytest.raises(InvalidInput, match="special_tokens_map.json resolves to /etc/passwd"):
        copy_tokenizer(model, tmp_path / "out")
    assert not (tmp_path / "out" / "special_tokens_map.json").exists()
    with pytest.raises(InvalidInput, match="outside the folder"):
        copy_confined(model / "special_tokens_map.json", tmp_path / "x", folder_roots(model))


# ------------------------------------------------------------------------------------ the Hugging Face cache


def hf_cache(root: Path, source: Path, repo: str = "models--trtpipe--tiny") -> tuple[Path, str]:
    """A Hugging Face hub cache laid out as huggingface_hub writes it: blobs/<sha256> and
    snapshots/<commit>/<file> -> ../../blobs/<sha256> (refs/main names the commit)."""
    revision = hashlib.sha1(b"trtpipe").hexdigest()
    base = root / repo
    snapshot = base / "snapshots" / revision
    (base / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    (base / "refs").mkdir()
    (base / "refs" / "main").write_text(revision)
    for path in sorted(source.iterdir()):
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        shutil.copy(path, base / "blobs" / digest)
        os.symlink(f"../../blobs/{digest}", snapshot / path.name)
    return snapshot, revision


def test_the_hugging_face_cache_layout_is_allowed(cli, tiny_llama_dir: Path, tmp_path: Path) -> None:
    snapshot, _ = hf_cache(tmp_path / "hub", tiny_llama_dir)
    assert all(p.is_symlink() for p in snapshot.iterdir())
    assert folder_roots(snapshot) == (snapshot.resolve(), (tmp_path / "hub" / "models--trtpipe--tiny" / "blobs").resolve())
    result = cli("spec-check", "--weights", spec_for(tmp_path, snapshot))
    assert result.code == 0, result.err


def test_a_snapshot_link_outside_its_repositorys_blobs_is_refused(cli, tiny_llama_dir: Path, tmp_path: Path) -> None:
    snapshot, _ = hf_cache(tmp_path / "hub", tiny_llama_dir)
    other, _ = hf_cache(tmp_path / "hub", tiny_llama_dir, repo="models--someone--else")
    # into another repository's blobs: outside this one's boundary
    (snapshot / "tokenizer.json").unlink()
    os.symlink(os.path.realpath(other / "tokenizer.json"), snapshot / "tokenizer.json")
    result = cli("spec-check", "--weights", spec_for(tmp_path, snapshot))
    assert result.code == 2 and "models--someone--else/blobs" in one_error(result)
    (snapshot / "tokenizer.json").unlink()
    # a relative link climbing out of the cache to /etc/passwd, however deep the test's folder lies
    os.symlink(os.path.relpath("/etc/passwd", snapshot), snapshot / "tokenizer.json")
    result = cli("spec-check", "--weights", spec_for(tmp_path, snapshot))
    assert result.code == 2 and "resolves to /etc/passwd, outside the model folder" in one_error(result)


@pytest.mark.timeout(300)
def test_a_repo_id_resolved_from_the_cache_is_checked_the_same_way(tiny_llama_dir: Path, tmp_path: Path) -> None:
    """model.repo_id + revision: resolve finds the snapshot with huggingface_hub (offline), then confines it."""
    snapshot, revision = hf_cache(tmp_path / "hub", tiny_llama_dir)
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"name: tiny\nmodel:\n  repo_id: trtpipe/tiny\n  revision: {revision}\n  dtype: float16\n{LIMITS}")
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}

    def spec_check() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "trtpipe.cli", "spec-check", "--weights", str(spec)],
                              capture_output=True, text=True, env=env, timeout=280)

    ok = spec_check()
    assert ok.returncode == 0, ok.stderr
    (snapshot / "config.json").unlink()
    os.symlink("/etc/hostname", snapshot / "config.json")
    refused = spec_check()
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert f"{spec}:3:" in refused.stderr and "config.json resolves to /etc/hostname" in refused.stderr


def test_check_tokenizer_reports_the_facts_the_serving_models_use(tiny_llama_dir: Path) -> None:
    facts = check_tokenizer(tiny_llama_dir)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tiny_llama_dir / "tokenizer.json"))
    eos = json.loads((tiny_llama_dir / "tokenizer_config.json").read_text())["eos_token"]
    assert facts.vocab_size == tokenizer.get_vocab_size() and facts.end_id == tokenizer.token_to_id(eos)


def test_one_end_token_rule_read_two_ways(tiny_llama_dir: Path, tmp_path: Path) -> None:
    """The preprocessing model prefers tokenizer_config.json's eos_token, the LLM API generation_config.json's
    eos_token_id (its first, when a list); each falls back on the other, and an empty list names no token (it
    raised IndexError in smoke's copy of the rule)."""
    from tokenizers import Tokenizer

    from trtpipe.model_folder import end_token_id
    from trtpipe.reference.hf_loader import hf_end_id
    from trtpipe.serving.smoke import end_id_of

    folder = tmp_path / "tok"
    folder.mkdir()
    shutil.copy(tiny_llama_dir / "tokenizer.json", folder / "tokenizer.json")
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    eos = json.loads((tiny_llama_dir / "tokenizer_config.json").read_text())["eos_token"]
    by_name = tokenizer.token_to_id(eos)
    other = by_name + 3

    def write(tokenizer_config: dict | None, generation_config: dict | None) -> None:
        for name, value in (("tokenizer_config.json", tokenizer_config), ("generation_config.json", generation_config)):
            (folder / name).unlink(missing_ok=True)
            if value is not None:
                (folder / name).write_text(json.dumps(value))

    cases = [  # (tokenizer_config, generation_config) -> (preprocessing, llm-api)
        (({"eos_token": eos}, {"eos_token_id": other}), (by_name, other)),
        (({"eos_token": {"content": eos}}, {"eos_token_id": [other, by_name]}), (by_name, other)),
        (({"eos_token": eos}, {"eos_token_id": []}), (by_name, by_name)),
        ((None, {"eos_token_id": []}), (None, None)),
        (({"eos_token": "<no-such-token>"}, {"eos_token_id": other}), (other, other)),
        ((None, {"eos_token_id": True}), (None, None)),
        ((None, None), (None, None)),
    ]
    for configs, (preprocessing, llm_api) in cases:
        write(*configs)
        assert (end_token_id(folder, "preprocessing"), end_token_id(folder, "llm-api")) == (preprocessing, llm_api), configs
        assert (end_id_of(folder), hf_end_id(folder)) == (preprocessing, llm_api), configs
