"""Fixtures shared by every test area. Area-specific fixtures live in tests/<area>/conftest.py."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from trtpipe.settings import Settings


def pytest_configure(config: pytest.Config) -> None:
    # A run started in the background by a shell without job control (`cmd &` in a script, some CI runners)
    # inherits SIGINT ignored, and so does every process it starts: the Ctrl-C tests would then send a signal
    # nobody hears (a fresh-clone run of this suite failed both that way). A terminal's Ctrl-C reaches a
    # process whose SIGINT is the default: give the run that, and so its children.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# How the suite splits over pytest-xdist workers (`-n 2 --dist loadgroup`, as scripts/test.sh runs it): each test
# file on one worker, so its module fixtures are built once; and every test that starts a local Ray cluster on the
# same worker, one cluster at a time (tests/matrix). Without xdist the marks do nothing.
TESTS = Path(__file__).resolve().parent
RAY_TESTS = ("matrix",)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        rel = Path(item.path).resolve().relative_to(TESTS)
        group = "ray" if rel.parts[0] in RAY_TESTS else rel.as_posix()
        item.add_marker(pytest.mark.xdist_group(group))


# Links this environment's site-packages into a fresh venv's, one symlink per entry, leaving out trtpipe's own
# entries (the package, its dist-info, the editable install's .pth and finder): the venv then has every dependency
# (pip and setuptools included) "already installed" without a second multi-GB install or a download, and trtpipe
# only from what is installed into it. A script, not a function, so a shell stand-in can run it too.
_LINK_DEPENDENCIES = """\
import subprocess, sys
from pathlib import Path

source, venv = Path(sys.argv[1]), Path(sys.argv[2])
probe = "import sysconfig; print(sysconfig.get_path('purelib'))"
purelib = Path(subprocess.run([str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True,
                              check=True).stdout.strip())
assert purelib != source and purelib.is_dir(), purelib
for entry in sorted(source.iterdir()):
    if entry.name != "__pycache__" and "trtpipe" not in entry.name.lower():
        (purelib / entry.name).symlink_to(entry)
"""


@dataclass(frozen=True)
class DependencyVenvs:
    """Makes virtual environments that hold this environment's dependencies and no trtpipe."""

    python: Path  # this environment's interpreter
    site_packages: Path  # what is linked
    linker: Path  # the script above: `python LINKER SITE_PACKAGES VENV`

    def create(self, root: Path) -> Path:
        """A fresh venv at `root` (no pip of its own) with the dependencies linked in; returns its site-packages."""
        subprocess.run([str(self.python), "-m", "venv", "--without-pip", str(root)], check=True, timeout=300)
        self.link(root)
        return self.purelib(root)

    def link(self, root: Path) -> None:
        subprocess.run([str(self.python), str(self.linker), str(self.site_packages), str(root)], check=True,
                       timeout=300)

    @staticmethod
    def purelib(root: Path) -> Path:
        probe = "import sysconfig; print(sysconfig.get_path('purelib'))"
        return Path(subprocess.run([str(root / "bin" / "python"), "-c", probe], capture_output=True, text=True,
                                   check=True, timeout=120).stdout.strip())


@pytest.fixture(scope="session")
def dependency_venvs(tmp_path_factory: pytest.TempPathFactory) -> DependencyVenvs:
    linker = tmp_path_factory.mktemp("dependency-venvs") / "link_dependencies.py"
    linker.write_text(_LINK_DEPENDENCIES)
    return DependencyVenvs(python=Path(sys.executable), site_packages=Path(sysconfig.get_path("purelib")), linker=linker)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A deterministic, briefly trained tiny Llama HF directory (safetensors + tokenizer)."""
    from trtpipe.checkpoint.example_model import write_example_model

    out = tmp_path_factory.mktemp("models") / "tiny-llama"
    write_example_model(out, arch="llama")
    return out


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Qwen2 variant of the tiny model (QKV bias)."""
    from trtpipe.checkpoint.example_model import write_example_model

    out = tmp_path_factory.mktemp("models") / "tiny-qwen2"
    write_example_model(out, arch="qwen2")
    return out


@pytest.fixture(scope="session")
def example_model_dir(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest):
    """example_model_dir(arch="llama", tied=False) -> the tiny example model folder of that architecture
    (llama, qwen2, mistral), with its output head tied to the input embedding when `tied`; each written once
    per session (the untied Llama and Qwen2 are tiny_llama_dir and tiny_qwen2_dir)."""
    from trtpipe.checkpoint.example_model import write_example_model

    made: dict[tuple[str, bool], Path] = {}

    def get(arch: str = "llama", tied: bool = False) -> Path:
        if not tied and arch in ("llama", "qwen2"):
            return request.getfixturevalue(f"tiny_{arch}_dir")
        if (arch, tied) not in made:
            out = tmp_path_factory.mktemp("models") / f"tiny-{arch}{'-tied' if tied else ''}"
            write_example_model(out, arch=arch, tied=tied)
            made[(arch, tied)] = out
        return made[(arch, tied)]

    return get


# The tiny example model with one semantic field changed each (trtpipe.model_semantics; issue 30's test models).
SEMANTIC_VARIANTS = {
    "mistral-window": {"arch": "mistral", "variant": {"sliding_window": 32}},
    "llama3-rope": {"arch": "llama", "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64}},
    "vocab-1001": {"arch": "llama", "variant": {"vocab_size": 1001}},
    "mha-head-dim": {"arch": "llama", "variant": {"head_dim": 32, "num_kv_heads": 4}},
    "qwen2-tied": {"arch": "qwen2", "tied": True},
}


@pytest.fixture(scope="session")
def semantic_model(tmp_path_factory: pytest.TempPathFactory):
    """semantic_model(name) -> the HF folder of a SEMANTIC_VARIANTS model, written once per session."""
    from trtpipe.checkpoint.example_model import Variant, write_example_model

    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            recipe = dict(SEMANTIC_VARIANTS[name])
            variant = Variant(**recipe.pop("variant", {}))
            out = tmp_path_factory.mktemp("semantics") / name
            write_example_model(out, variant=variant, **recipe)
            made[name] = out
        return made[name]

    return get


@pytest.fixture
def trtpipe_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An isolated artifact store for one test."""
    home = tmp_path / "trtpipe-home"
    home.mkdir()
    monkeypatch.setenv("TRTPIPE_HOME", str(home))
    return home


# --------------------------------------------------------------------------- the published tiny example
# The tiny Llama built and published by the real pipeline (resolve -> plan -> checkpoint -> engine ->
# publish) with a store under a test's folder: the serving, bench and identity tests serve it.

EXAMPLE_LIMITS = {"max_batch_size": 4, "max_input_len": 64, "max_seq_len": 128}


def write_example_spec(
    spec_dir: Path, model_dir: Path, *, streaming: bool = True, name: str = "tiny-llama-cpu"
) -> Path:
    """A cpu-reference build spec for the tiny model (small limits, so tests can exceed them)."""
    spec_dir.mkdir(parents=True, exist_ok=True)
    limits = EXAMPLE_LIMITS
    text = (
        f"name: {name}\n"
        "model:\n"
        f"  path: {model_dir.resolve()}\n"
        "  dtype: float16\n"
        "target:\n"
        "  gpu: cpu-reference\n"
        "engine:\n"
        f"  max_batch_size: {limits['max_batch_size']}\n"
        f"  max_input_len: {limits['max_input_len']}\n"
        f"  max_seq_len: {limits['max_seq_len']}\n"
        "triton:\n"
        f"  streaming: {'true' if streaming else 'false'}\n"
    )
    path = spec_dir / f"{name}.yaml"
    path.write_text(text)
    return path


def _publish_example(tmp_dir: Path, *, streaming: bool = True, model_dir: Path | None = None) -> Path:
    """Build and publish the tiny example under `tmp_dir`; returns the model repository path.

    The spec is written to `tmp_dir/spec/tiny-llama-cpu.yaml` (`tiny-llama-cpu-unary.yaml` with
    streaming=False) and the store is `tmp_dir/store` (the repository lives in it).
    """
    from trtpipe.pipeline import run_build

    tmp_dir = Path(tmp_dir)
    tmp_dir.mkdir(parents=True, exist_ok=True)
    if model_dir is None:
        from trtpipe.checkpoint.example_model import write_example_model

        model_dir = tmp_dir / "tiny-llama"
        if not (model_dir / "config.json").is_file():
            write_example_model(model_dir, arch="llama")
    # One store per tmp_dir: a second call (say streaming=False) reuses the checkpoint and engine.
    name = "tiny-llama-cpu" if streaming else "tiny-llama-cpu-unary"
    spec_path = write_example_spec(tmp_dir / "spec", Path(model_dir), streaming=streaming, name=name)
    report = run_build(spec_path, store=tmp_dir / "store", progress=False, settings=Settings.from_env())
    if report.repository_path:
        return Path(report.repository_path)
    raise AssertionError(f"building the example published no repository: {report.status}: "
                         f"{report.error or report.message}")


@pytest.fixture(scope="session")
def publish_example():
    """publish_example(tmp_dir, *, streaming=True, model_dir=None) -> the published repository path.

    The spec is written to `tmp_dir/spec/tiny-llama-cpu.yaml` (`tiny-llama-cpu-unary.yaml` with
    streaming=False) and the store is `tmp_dir/store` (the repository lives in it): a second call
    with the same tmp_dir reuses the checkpoint and engine."""
    return _publish_example


# --------------------------------------------------------------------------- OCI registry
# A real registry (Debian's docker-registry) on 127.0.0.1, shared by the store (remote cache) and
# release (push/pull, channels) tests. Skips where docker-registry is not installed.

REGISTRY_USER = "trtpipe-ci"
REGISTRY_PASSWORD = "s3cret-Registry-Pw-7f3a"


@dataclass(frozen=True)
class RegistryHandle:
    host: str  # 127.0.0.1:PORT
    root: Path  # the registry's storage root (blobs live under docker/registry/v2/blobs)
    username: str
    password: str

    def url(self, repository: str) -> str:
        return f"oci://{self.host}/{repository}"

    def blob_data_path(self, digest: str) -> Path:
        hexd = digest.split(":", 1)[1]
        return self.root / "docker" / "registry" / "v2" / "blobs" / "sha256" / hexd[:2] / hexd / "data"


@contextlib.contextmanager
def _serve_registry(base: Path, auth: list[str], username: str, password: str) -> Iterator[RegistryHandle]:
    """Run docker-registry with storage under `base` and the given `auth:` config lines until the block ends."""
    import shutil
    import socket
    import time

    import requests

    binary = shutil.which("docker-registry")
    if binary is None:
        pytest.skip("docker-registry is not installed (apt-get install -y docker-registry; scripts/install.sh --test does it)")
    root = base / "storage"
    root.mkdir()
    log_path = base / "registry.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("REGISTRY_")}
    # The port is picked free, then bound by the registry: another process can take it in between (many servers
    # start at once in a loaded suite). A registry that exits on "address already in use" is started again on a
    # new port, three times at most.
    for _attempt in range(3):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        config = base / "config.yml"
        config.write_text("\n".join([
            "version: 0.1", "log:", "  level: warn", "storage:", "  filesystem:", f"    rootdirectory: {root}",
            "  delete:", "    enabled: true",
            "http:", f"  addr: 127.0.0.1:{port}", "  secret: trtpipe-test-secret", "  draintimeout: 5s",
            "auth:", *auth, "",
        ]))  # fmt: skip
        log = open(log_path, "wb")
        proc = subprocess.Popen([binary, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT, env=env)
        host = f"127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while True:
            try:
                if requests.get(f"http://{host}/v2/", timeout=1).status_code == 401:
                    break
            except requests.RequestException:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if proc.poll() is None and time.monotonic() <= deadline:
            break
        proc.kill()
        proc.wait()
        log.close()
        if "address already in use" not in log_path.read_text(errors="replace"):
            raise RuntimeError(f"docker-registry did not start: {log_path.read_text()[-2000:]}")
    else:
        raise RuntimeError(f"docker-registry did not start: {log_path.read_text()[-2000:]}")
    try:
        yield RegistryHandle(host=host, root=root, username=username, password=password)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture(scope="session")
def serve_registry():
    """serve_registry(base, auth_lines, username, password): a context manager yielding a RegistryHandle."""
    return _serve_registry


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryHandle]:
    """docker-registry with htpasswd auth for the session (REGISTRY_USER / REGISTRY_PASSWORD)."""
    base = tmp_path_factory.mktemp("registry")
    htpasswd = base / "htpasswd"
    # Written before start: a missing file makes the registry invent a password and log it. Cost 5: it is checked per request.
    import bcrypt

    hashed = bcrypt.hashpw(REGISTRY_PASSWORD.encode(), bcrypt.gensalt(rounds=5)).decode()
    htpasswd.write_text(f"{REGISTRY_USER}:{hashed}\n")
    auth = ["  htpasswd:", "    realm: trtpipe-test", f"    path: {htpasswd}"]
    with _serve_registry(base, auth, REGISTRY_USER, REGISTRY_PASSWORD) as handle:
        yield handle


# --------------------------------------------------------------------------- LLM-API artifacts (issue 16)
# The llm-api backend's artifact, made by the artifact stage's own export (trtpipe.checkpoint.hf_export) from a
# cpu-reference spec of the tiny model: ModelOpt's unified HF export (or, unquantized, the HF weights re-saved as
# float16 safetensors), the tokenizer files and llm_args.json (the LLM() keyword arguments the spec implies).

# The limits every test artifact's llm_args.json carries (tests/serving check the model enforces them).
LLMAPI_ENGINE = {"max_batch_size": 4, "max_input_len": 64, "max_seq_len": 128, "max_num_tokens": 64}


def export_llmapi_artifact(model_dir: Path, out: Path, *, algo: str = "none", kv_cache: str = "auto",
                           calibration_samples: int = 8) -> Path:
    """Write an LLM-API artifact of `model_dir` into `out` (absent): none, fp8 or int4_awq, kv_cache auto or fp8."""
    import yaml

    from trtpipe.checkpoint.hf_export import export_hf_artifact
    from trtpipe.resolve import resolve
    from trtpipe.spec_loader import load_spec

    spec = {
        "name": "tiny-llmapi",
        "model": {"path": str(model_dir), "dtype": "float16"},
        "target": {"gpu": "cpu-reference"},
        "quantization": {"algo": algo, "kv_cache": kv_cache,
                         "calibration": {"samples": calibration_samples, "max_seq_len": 64}},
        "engine": LLMAPI_ENGINE,
        "backend": "llm-api",
    }
    spec_path = out.with_name(f"{out.name}.spec.yaml")
    spec_path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    out.mkdir(parents=True)
    export_hf_artifact(resolve(load_spec(spec_path)), out)
    return out


@pytest.fixture(scope="session")
def llmapi_artifact(tiny_llama_dir: Path, tiny_qwen2_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """llmapi_artifact(arch="llama", algo="none", kv_cache="auto") -> an LLM-API artifact dir, made once per session."""
    cache: dict[tuple[str, str, str], Path] = {}
    models = {"llama": tiny_llama_dir, "qwen2": tiny_qwen2_dir}

    def make(arch: str = "llama", algo: str = "none", kv_cache: str = "auto") -> Path:
        key = (arch, algo, kv_cache)
        if key not in cache:
            out = tmp_path_factory.mktemp("llmapi") / f"{arch}-{algo}-{kv_cache}"
            cache[key] = export_llmapi_artifact(models[arch], out, algo=algo, kv_cache=kv_cache)
        return cache[key]

    return make


@pytest.fixture(scope="session")
def export_llmapi():
    """export_llmapi(model_dir, out, *, algo="none", kv_cache="auto") -> a fresh LLM-API artifact (not cached):
    parity's independent export, made again instead of read from what a server loads."""
    return export_llmapi_artifact


# --------------------------------------------------------------------------- stand-in trtllm-build engines (issue 22)
# An engine folder shaped like trtllm-build 1.2.1's output for a spec (what tensorrt_llm/builder.py Engine.save writes:
# config.json = {version, pretrained_config, build_config}, one rank{N}.engine per rank), with dummy engine bytes:
# `trtpipe publish SPEC --engine DIR` checks and publishes it as it would a real one. No TensorRT needed.


def write_standin_engine(spec: Path, out: Path, *, world: int | None = None, tokenizer_from: Path | None = None,
                         **changes: object) -> Path:
    """Write a stand-in engine for the spec `spec` into `out` (absent) and return it. `changes` set config.json
    fields by a path with `__` between keys (e.g. build_config__max_batch_size=128; the value None removes the
    field); `world` writes that many rank files instead of tp x pp; `tokenizer_from` copies a tokenizer's files in
    beside the engine (as some hand-made engine folders keep them)."""
    import json
    import shutil

    from trtpipe.engine.plan import make_build_plan
    from trtpipe.quant import FORMATS, KV_CACHES
    from trtpipe.resolve import resolve
    from trtpipe.spec_loader import load_spec

    resolved = resolve(load_spec(spec), need_weights=False)
    plan = make_build_plan(resolved)
    model = resolved.model_config
    dtype = resolved.weight_dtype
    fmt = FORMATS[resolved.spec.quantization.algo]
    quantization = {"quant_algo": fmt.checkpoint_algo,
                    "kv_cache_quant_algo": KV_CACHES[resolved.spec.quantization.kv_cache].checkpoint_algo}
    if fmt.grouped:
        quantization.update(group_size=resolved.spec.quantization.group_size, has_zero_point=False,
                            pre_quant_scale=True)
    # trtllm-build records "auto" plugins as the model dtype and a disabled one as null (as tests/engine/test_validate).
    plugins = {k: (dtype if v == "auto" else v) for k, v in plan.plugin_config.items()}
    plugins.update(dtype=dtype, paged_kv_cache=True, nccl_plugin=dtype if plan.world_size > 1 else None)
    limits = {k: v for k, v in plan.limits.items() if k != "kv_cache_type"}
    config = {
        "version": resolved.toolchain.trtllm_version,
        "pretrained_config": {
            "architecture": (model.get("architectures") or ["LlamaForCausalLM"])[0],
            "dtype": dtype,
            "logits_dtype": "float16" if dtype == "bfloat16" else dtype,
            "vocab_size": model.get("vocab_size"),
            "hidden_size": model.get("hidden_size"),
            "num_hidden_layers": model.get("num_hidden_layers"),
            "num_attention_heads": model.get("num_attention_heads"),
            "num_key_value_heads": model.get("num_key_value_heads"),
            "max_position_embeddings": model.get("max_position_embeddings"),
            "mapping": {"world_size": plan.world_size, "gpus_per_node": 8, "tp_size": plan.tp, "pp_size": plan.pp},
            "quantization": quantization,
        },
        "build_config": {**limits, "kv_cache_type": "PAGED", "max_prompt_embedding_table_size": 0,
                         "gather_context_logits": False, "gather_generation_logits": False, "strongly_typed": True,
                         "max_draft_len": 0, "plugin_config": plugins},
    }
    for dotted, value in changes.items():
        target = config
        *parents, last = dotted.split("__")
        for part in parents:
            target = target[part]
        if value is None:
            target.pop(last, None)
        else:
            target[last] = value
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(config, indent=4), encoding="utf-8")
    for rank in range(plan.world_size if world is None else world):
        (out / f"rank{rank}.engine").write_bytes(f"stand-in TensorRT engine, rank {rank}\n".encode() * 64)
    if tokenizer_from is not None:
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
            if (tokenizer_from / name).is_file():
                shutil.copy2(tokenizer_from / name, out / name)
    return out


@pytest.fixture(scope="session")
def standin_engine():
    """standin_engine(spec, out, *, world=None, tokenizer_from=None, **changes) -> a stand-in trtllm-build engine
    folder for the spec (write_standin_engine)."""
    return write_standin_engine
