"""Start-up cost of the CLI: a warm `trtpipe build` (every stage a hit) against bare `trtpipe --help`.
Prints one JSON object.

The baseline is measured in the same run, interleaved with the thing measured (help, warm build,
help, warm build ...), so machine load shifts both alike; medians of `--repeat` runs each. Also
reported: `python -c pass` (the interpreter alone), the modules each command imports that it should
not need (torch, transformers, modelopt, tritonclient, matplotlib, rich on the warm path), and the
slowest imports of each (from `python -X importtime`), to find what to make lazy.

A warm build reuses the resolution memo (trtpipe.warm) once its inputs are older than the racy window: the
first warm build after the cold one may still resolve (it writes the memo); `warm_stage_outcomes` is that
one, `timed_warm_stage_outcomes` a build after the timed ones (resolve and plan `hit`: the memo was used).

Bytecode: the commands run with the environment's setting (PYTHONDONTWRITEBYTECODE=1 here, so trtpipe's own
modules compile from source on every run, which no installed trtpipe does); `--cache-bytecode` lets them
cache bytecode under the work folder (PYTHONPYCACHEPREFIX), as an installed package has it.

Usage: .venv/bin/python benchmarks/cli_startup.py [--repeat 7] [--workdir DIR] [--cache-bytecode]
The goal the issue set: warm build <= 1.3 x bare --help.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "modelopt", "tritonclient", "matplotlib", "numpy", "grpc", "rich", "requests",
         "oras", "docker")


def _env(home: Path, pycache: Path | None) -> dict[str, str]:
    env = dict(os.environ, TRTPIPE_HOME=str(home), PYTHONPATH=str(REPO))
    if pycache is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(pycache)
    return env


def _timed(argv: list[str], env: dict[str, str], cpu: list[float] | None = None) -> float:
    """Wall seconds of one run; its CPU seconds (user + system, from wait4) appended to `cpu` when given."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = proc.stderr.read() if proc.stderr else b""
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - started
    if status != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({status}): {err.decode(errors='replace')[-2000:]}")
    if cpu is not None:
        cpu.append(usage.ru_utime + usage.ru_stime)
    return elapsed


def _imports(argv: list[str], env: dict[str, str]) -> tuple[set[str], list[tuple[str, int]]]:
    """(top-level packages imported, the 12 slowest imports with their cumulative microseconds)."""
    done = subprocess.run([sys.executable, "-X", "importtime", *argv[1:]], env=env, capture_output=True, text=True)
    rows = []
    for line in done.stderr.splitlines():
        match = re.match(r"import time:\s+(\d+) \|\s+(\d+) \| (\s*)(\S+)", line)
        if match:
            rows.append((match.group(4), int(match.group(2)), len(match.group(3))))
    top = {name.split(".")[0] for name, _, _ in rows}
    slowest = sorted(((name, cumulative) for name, cumulative, depth in rows if depth <= 4), key=lambda r: -r[1])
    return top, slowest[:12]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--cache-bytecode", action="store_true",
                        help="let the commands cache bytecode under the work folder (as an installed package has it)")
    args = parser.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="trtpipe-startup-"))
    home = work / "home"
    env = _env(home, work / "pycache" if args.cache_bytecode else None)
    cli = [sys.executable, "-m", "trtpipe.cli"]

    model = work / "tiny-llama"
    if not (model / "config.json").is_file():
        subprocess.run([*cli, "example-model", str(model)], env=env, check=True, capture_output=True)
        time.sleep(2.1)  # past the digest cache's racy window, as real inputs are
    spec = work / "tiny.yaml"
    spec.write_text(f"name: tiny-llama-cpu\nmodel:\n  path: {model}\ntarget:\n  gpu: cpu-reference\n")
    build = [*cli, "build", str(spec), "--json"]
    cold = _timed(build, env)
    warm_report = json.loads(subprocess.run(build, env=env, capture_output=True, text=True, check=True).stdout)
    outcomes = {s["name"]: s["outcome"] for s in warm_report["stages"]}
    assert all(o in ("ran", "hit") for o in outcomes.values()), outcomes

    python_alone, helps, warms, helps_cpu, warms_cpu = [], [], [], [], []
    for _ in range(args.repeat):
        python_alone.append(_timed([sys.executable, "-c", "pass"], env))
        helps.append(_timed([*cli, "--help"], env, helps_cpu))
        warms.append(_timed(build, env, warms_cpu))
    timed_report = json.loads(subprocess.run(build, env=env, capture_output=True, text=True, check=True).stdout)
    help_imports, help_slowest = _imports([*cli, "--help"], env)
    warm_imports, warm_slowest = _imports(build, env)
    help_s, warm_s = statistics.median(helps), statistics.median(warms)
    print(json.dumps({
        "repeat": args.repeat,
        "python_alone_s": round(statistics.median(python_alone), 4),
        "help_s": round(help_s, 4),
        "warm_build_s": round(warm_s, 4),
        "warm_over_help": round(warm_s / help_s, 3),
        "goal_warm_over_help": 1.3,
        # CPU time (user + system) is what a loaded machine inflates least: the same ratio, without the waits.
        "help_cpu_s": round(statistics.median(helps_cpu), 4),
        "warm_build_cpu_s": round(statistics.median(warms_cpu), 4),
        "warm_over_help_cpu": round(statistics.median(warms_cpu) / statistics.median(helps_cpu), 3),
        "cold_build_s": round(cold, 2),
        "warm_stage_outcomes": outcomes,
        "timed_warm_stage_outcomes": {st["name"]: st["outcome"] for st in timed_report["stages"]},
        "bytecode": (f"cached under {work / 'pycache'}" if args.cache_bytecode
                     else f"as the environment says (PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE')})"),
        "help_runs_s": [round(x, 4) for x in helps],
        "warm_runs_s": [round(x, 4) for x in warms],
        "heavy_imported_by_help": sorted(set(HEAVY) & help_imports),
        "heavy_imported_by_warm_build": sorted(set(HEAVY) & warm_imports),
        "slowest_imports_help_us": help_slowest,
        "slowest_imports_warm_build_us": warm_slowest,
        "workdir": str(work),
    }, indent=2))


if __name__ == "__main__":
    main()
