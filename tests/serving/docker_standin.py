"""A stand-in for `docker` on a host without a Docker daemon or GPU: it accepts the `docker run` argv that
`trtpipe serve` runs for a GPU repository (trtpipe.serving.server.docker_command) and starts the CPU tritonserver
in its place, on the host folder the `-v HOST:CONTAINER:ro` mount names and on the ports the command publishes, so
the container path (trtpipe.serving.container) is exercised for real. It replaces itself with tritonserver (exec):
the process trtpipe watches is then the server, whose Python-backend stubs are its children, as a test needs.

Run as `python docker_standin.py run ...` (a wrapper script is the runtime executable). Environment:
  STANDIN_CALLS   a file each call appends its argv to (one JSON list a line)
  STANDIN_WORK    a folder for the server's private backends folder
  STANDIN_SHM     the shared-memory prefix the stand-in's server uses (the test removes what a killed stub leaves)
  STANDIN_MODE    serve (default); fail: print a few log lines and exit 1 at once, as a container whose server
                  cannot start; other: serve the folder STANDIN_OTHER instead of the mounted one
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import uuid
from pathlib import Path
from types import SimpleNamespace

VALUE_OPTIONS = {"--name", "--gpus", "--shm-size", "--ulimit", "-p", "-v"}
SWITCHES = {"--rm", "--init"}


def fail(message: str, code: int = 125) -> None:
    print(f"docker-standin: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


def parse_run(args: list[str]) -> tuple[dict[str, list[str]], str, list[str]]:
    """(options, image, command) of `docker run OPTIONS IMAGE COMMAND...`."""
    options: dict[str, list[str]] = {}
    i = 0
    while i < len(args) and args[i].startswith("-"):
        arg = args[i]
        name, _, value = arg.partition("=")
        if name in SWITCHES:
            options.setdefault(name, []).append("")
        elif name in VALUE_OPTIONS:
            if not value:
                i += 1
                value = args[i]
            options.setdefault(name, []).append(value)
        else:
            fail(f"unknown docker run option {arg}")
        i += 1
    if i >= len(args):
        fail("no image")
    return options, args[i], args[i + 1:]


def main(argv: list[str]) -> None:
    calls = os.environ.get("STANDIN_CALLS")
    if calls:
        with open(calls, "a", encoding="utf-8") as out:
            out.write(json.dumps(argv) + "\n")
    if not argv:
        fail("no command")
    leaked = [name for name in ("TRTPIPE_REGISTRY_PASSWORD", "TRTPIPE_SIGNING_KEY") if name in os.environ]
    if leaked:  # the container runs repository code: trtpipe never hands it a secret
        fail(f"secret variables in the container runtime's environment: {', '.join(leaked)}")
    if argv[0] == "rm":
        return  # `docker rm -f NAME`: the stand-in's "container" is the server process itself
    if argv[0] != "run":
        fail(f"the stand-in knows run and rm, not {argv[0]}")
    options, _image, command = parse_run(argv[1:])
    if command[:2] == ["mpirun", "--allow-run-as-root"]:
        command = command[2:]
        if command[:2] != ["-n", "1"] or ":" in command:
            fail("the stand-in runs one rank")
        command = command[2:]
    if not command or not command[0].endswith("/tritonserver"):
        fail(f"not a tritonserver command: {command[:1]}")
    flags = dict(a.split("=", 1) for a in command[1:] if a.startswith("--") and "=" in a)
    mounts = {}
    for spec in options.get("-v", []):
        host, container, *mode = spec.split(":")
        if mode != ["ro"]:
            fail(f"the repository must be mounted read-only: {spec}")
        mounts[container] = host
    published = {p.rsplit(":", 2)[0] + ":" + p.rsplit(":", 1)[1] for p in options.get("-p", [])}
    ports = tuple(int(flags[f"--{k}-port"]) for k in ("grpc", "http", "metrics"))
    for port in ports:
        if f"127.0.0.1:{port}" not in published:
            fail(f"port {port} is not published on 127.0.0.1 ({sorted(published)})")
    repository = mounts.get(flags["--model-repository"])
    if repository is None:
        fail(f"--model-repository={flags['--model-repository']} is no mount")
    mode = os.environ.get("STANDIN_MODE", "serve")
    if mode == "fail":
        print("I1201 00:00:00.000 1 server.cc:1] stand-in container starting", flush=True)
        print("E1201 00:00:00.001 1 model_repository_manager.cc:1] failed to load 'tensorrt_llm': stand-in failure",
              flush=True)
        print("error: creating server: Internal - failed to load all models", flush=True)
        sys.exit(1)
    if mode == "other":
        repository = os.environ["STANDIN_OTHER"]

    from trtpipe.serving.server import LocalTriton

    local = LocalTriton.here()
    work = Path(tempfile.mkdtemp(prefix="standin-", dir=os.environ.get("STANDIN_WORK")))
    shm = os.environ.get("STANDIN_SHM", "standin_") + uuid.uuid4().hex[:6] + "_"
    cmd = local.command(SimpleNamespace(path=Path(repository)), "127.0.0.1", ports, work, shm)
    os.execve(cmd[0], cmd, local.environment())


if __name__ == "__main__":
    main(sys.argv[1:])
