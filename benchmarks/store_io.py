"""Benchmark: does each byte get read once? Bytes read by a cold build, publish cost against engine size,
bytes read by push and pull. Prints one JSON object.

Every figure comes from a child process running the real CLI (`trtpipe.cli.main`), which reports its own
`/proc/self/io` when it ends:
- `rchar`: bytes returned by read()-family calls (files, pipes and sockets; page-cache hits included; NOT
  pages a process maps and touches, e.g. safetensors' mmap of the model during conversion). This is the
  figure the targets are stated in: "read the model's bytes N times" means N hashing or copying passes.
- `read_bytes`: bytes the process caused to be fetched from storage (mmap page-ins included, page-cache
  hits not). The model files are evicted from the page cache first (posix_fadvise DONTNEED), so it shows
  the conversion's one read of the model.

1. cold build: a fresh store builds a >= 2 GB fp16 Llama (random weights, 22 layers of TinyLlama's
   width) and, as the baseline in the same run, the tiny example. `rchar_per_model_byte` =
   (rchar(big) - rchar(tiny)) / (model bytes(big) - model bytes(tiny)): the per-byte cost, with what
   every build reads regardless of size (Python modules, configs) taken out by the baseline.
2. publish: `build --force publish` of the big and the tiny spec, interleaved, median of N each:
   `publish_ratio_big_vs_tiny` near 1 means O(1) in engine size (the engine is verified through the
   digest cache and hard-linked, never re-hashed).
3. push and pull of the big repository to a local docker-registry (no auth), each a child process:
   `rchar_per_artifact_byte` near 1 means the data is read once (push: the files; pull: the socket).

Usage: python benchmarks/store_io.py [--layers 22] [--repeats 5] [--workdir DIR] [--source TRTPIPE_ROOT] [--skip-oci]
`--source` runs another checkout's trtpipe (e.g. main, for a before/after table).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# A child: run the CLI, then write this process's I/O counters (and exit code, stdout) to a JSON file.
CHILD = """
import io, json, sys, time, contextlib
import trtpipe
from trtpipe.cli import main
out = io.StringIO()
started = time.perf_counter()
with contextlib.redirect_stdout(out):
    code = main(sys.argv[2:])
seconds = time.perf_counter() - started
counters = dict(line.split(": ") for line in open("/proc/self/io").read().splitlines())
json.dump({"code": code, "seconds": seconds, "stdout": out.getvalue(), "trtpipe": trtpipe.__file__,
           **{k: int(v) for k, v in counters.items()}}, open(sys.argv[1], "w"))
"""


def run_child(source: Path, work: Path, *args: str, env: dict[str, str] | None = None) -> dict:
    report = work / f"child-{time.monotonic_ns()}.json"
    full_env = {**os.environ, "PYTHONPATH": str(source), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"),
                **(env or {})}
    # cwd=work: `python -c` puts the working directory first on sys.path, ahead of PYTHONPATH.
    result = subprocess.run([sys.executable, "-c", CHILD, str(report), *args], env=full_env,
                            capture_output=True, text=True, cwd=work)
    if not report.is_file():
        raise SystemExit(f"trtpipe {' '.join(args)} died: {result.stderr[-3000:]}")
    data = json.loads(report.read_text())
    report.unlink()
    if not data["trtpipe"].startswith(str(source)):
        raise SystemExit(f"the child imported {data['trtpipe']}, not the trtpipe of {source}")
    if data["code"] != 0:
        raise SystemExit(f"trtpipe {' '.join(args)} exited {data['code']}: {result.stderr[-3000:]}")
    return data


def evict(folder: Path) -> None:
    """Drop a folder's files from the page cache (clean pages only; no privileges needed)."""
    for path in folder.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def model_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("*.safetensors"))


def write_big_llama(tiny: Path, out: Path, *, layers: int, hidden: int = 2048, intermediate: int = 5632,
                    heads: int = 32, kv_heads: int = 4, shard_bytes: int = 512 * 2**20) -> Path:
    """The tiny example's tokenizer and config, widened to TinyLlama's width with `layers` layers of random
    fp16 weights (HF Llama tensor names), written as safetensors shards with an index."""
    import numpy as np
    from safetensors.numpy import save_file

    out.mkdir(parents=True)
    for path in tiny.iterdir():
        if path.is_file() and not path.name.endswith(".safetensors") and not path.name.endswith(".index.json"):
            shutil.copy(path, out / path.name)
    config = json.loads((tiny / "config.json").read_text())
    vocab = int(config["vocab_size"])
    head_dim = hidden // heads
    config.update({"hidden_size": hidden, "intermediate_size": intermediate, "num_hidden_layers": layers,
                   "num_attention_heads": heads, "num_key_value_heads": kv_heads, "torch_dtype": "float16"})
    config.pop("head_dim", None)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    rng = np.random.default_rng(0)

    def tensor(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)

    names: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(layers):
        p = f"model.layers.{i}."
        names += [(p + "self_attn.q_proj.weight", (heads * head_dim, hidden)),
                  (p + "self_attn.k_proj.weight", (kv_heads * head_dim, hidden)),
                  (p + "self_attn.v_proj.weight", (kv_heads * head_dim, hidden)),
                  (p + "self_attn.o_proj.weight", (hidden, heads * head_dim)),
                  (p + "mlp.gate_proj.weight", (intermediate, hidden)),
                  (p + "mlp.up_proj.weight", (intermediate, hidden)),
                  (p + "mlp.down_proj.weight", (hidden, intermediate)),
                  (p + "input_layernorm.weight", (hidden,)),
                  (p + "post_attention_layernorm.weight", (hidden,))]
    names += [("model.norm.weight", (hidden,)), ("lm_head.weight", (vocab, hidden))]
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name, shape in names:
        array = np.ones(shape, dtype=np.float16) if name.endswith("norm.weight") else tensor(*shape)
        if size + array.nbytes > shard_bytes and shards[-1]:
            shards.append({})
            size = 0
        shards[-1][name] = array
        size += array.nbytes
    weight_map = {}
    for index, shard in enumerate(shards):
        file = f"model-{index + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / file), metadata={"format": "pt"})
        weight_map.update({name: file for name in shard})
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return out


def write_spec(path: Path, model: Path, name: str) -> Path:
    path.write_text(f"name: {name}\nmodel:\n  path: {model}\n  dtype: float16\ntarget:\n  gpu: cpu-reference\n"
                    "engine:\n  max_batch_size: 2\n  max_input_len: 64\n  max_seq_len: 128\n")
    return path


def bench_cold(source: Path, work: Path, tiny: Path, big: Path, store: Path) -> dict:
    figures = {}
    for label, model in (("tiny", tiny), ("big", big)):
        spec = write_spec(work / f"{label}.yaml", model, f"io-{label}")
        evict(model)
        child = run_child(source, work, "build", str(spec), "--json", "--store", str(store))
        report = json.loads(child["stdout"])
        assert {s["name"]: s["outcome"] for s in report["stages"]}["checkpoint"] == "built", report["stages"]
        figures[label] = {"model_bytes": model_bytes(model), "rchar": child["rchar"], "read_bytes": child["read_bytes"],
                          "wchar": child["wchar"], "seconds": round(child["seconds"], 2)}
    dm = figures["big"]["model_bytes"] - figures["tiny"]["model_bytes"]
    return {
        **figures,
        "rchar_per_model_byte": round((figures["big"]["rchar"] - figures["tiny"]["rchar"]) / dm, 3),
        "read_bytes_per_model_byte": round((figures["big"]["read_bytes"] - figures["tiny"]["read_bytes"]) / dm, 3),
        "rchar_per_model_byte_raw": round(figures["big"]["rchar"] / figures["big"]["model_bytes"], 3),
    }


def bench_publish(source: Path, work: Path, store: Path, repeats: int) -> dict:
    runs: dict[str, list[dict]] = {"tiny": [], "big": []}
    for _ in range(repeats):
        for label in ("tiny", "big"):
            child = run_child(source, work, "build", str(work / f"{label}.yaml"), "--force", "publish", "--json",
                              "--store", str(store))
            report = json.loads(child["stdout"])
            stage = next(s for s in report["stages"] if s["name"] == "publish")
            assert stage["outcome"] == "built", stage
            runs[label].append({"publish_s": stage["seconds"], "build_s": child["seconds"], "rchar": child["rchar"]})

    def median(label: str, field: str) -> float:
        return statistics.median(r[field] for r in runs[label])

    return {
        "repeats": repeats,
        "tiny": {f: round(median("tiny", f), 4) for f in ("publish_s", "build_s", "rchar")},
        "big": {f: round(median("big", f), 4) for f in ("publish_s", "build_s", "rchar")},
        "publish_ratio_big_vs_tiny": round(median("big", "publish_s") / median("tiny", "publish_s"), 3),
        "build_ratio_big_vs_tiny": round(median("big", "build_s") / median("tiny", "build_s"), 3),
    }


def start_registry(work: Path) -> tuple[subprocess.Popen, str]:
    binary = shutil.which("docker-registry")
    if binary is None:
        raise SystemExit("docker-registry is not installed (apt-get install -y docker-registry)")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = work / "registry.yml"
    config.write_text(f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {work / 'registry'}\n"
                      f"http:\n  addr: 127.0.0.1:{port}\n  secret: bench\n  draintimeout: 5s\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("REGISTRY_")}
    proc = subprocess.Popen([binary, "serve", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    import requests

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if requests.get(f"http://127.0.0.1:{port}/v2/", timeout=1).status_code == 200:
                return proc, f"127.0.0.1:{port}"
        except requests.RequestException:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("docker-registry did not start")


def bench_oci(source: Path, work: Path, store: Path) -> dict:
    proc, host = start_registry(work)
    env = {"HOME": str(work / "home")}  # no Docker config: the registry takes no credentials
    try:
        stored = json.loads(run_child(source, work, "cache", "ls", "--json", "--store", str(store))["stdout"])
        repo = max((e for e in stored if e["kind"] == "repository"), key=lambda e: e["size"])
        size = repo["size"]
        push = run_child(source, work, "cache", "push", f"repository/{repo['key']}", "--to", f"oci://{host}/bench/io",
                         "--tag", "v1", "--json", "--store", str(store), env=env)
        pull = run_child(source, work, "cache", "pull", f"oci://{host}/bench/io:v1", "--json",
                         "--store", str(work / "pulled"), env=env)
        assert json.loads(pull["stdout"])["artifact_digest"] == repo["digest"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    return {
        "artifact_bytes": size,
        "push": {"rchar": push["rchar"], "seconds": round(push["seconds"], 2),
                 "rchar_per_artifact_byte": round(push["rchar"] / size, 3)},
        "pull": {"rchar": pull["rchar"], "seconds": round(pull["seconds"], 2),
                 "rchar_per_artifact_byte": round(pull["rchar"] / size, 3)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=22)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--source", type=Path, default=REPO, help="the trtpipe checkout the children run")
    parser.add_argument("--skip-oci", action="store_true")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="trtpipe-bench-io-", dir=args.workdir))
    source = args.source.resolve()
    try:
        from trtpipe.checkpoint.example_model import write_example_model

        tiny = write_example_model(work / "tiny-llama", arch="llama")
        big = write_big_llama(tiny, work / "big-llama", layers=args.layers)
        time.sleep(2.1)  # past the digest cache's racy window, as real model files are
        store = work / "store"
        result = {
            "benchmark": "store_io",
            "source": str(source),
            "host": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
            "cold_build": bench_cold(source, work, tiny, big, store),
            "publish": bench_publish(source, work, store, args.repeats),
        }
        if not args.skip_oci:
            result["oci"] = bench_oci(source, work, store)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
