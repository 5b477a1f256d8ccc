"""`trtpipe serve` as a library call (trtpipe.serve_session), called the way the CLI calls it."""

from __future__ import annotations

import json
import shlex
import threading
from pathlib import Path

import pytest

from trtpipe.cli import main
from trtpipe.serve_session import ContentCheck, NotAContainerTarget, ServeRequest, print_command, serve
from trtpipe.workspace import Workspace
from trtpipe.settings import Settings



def _gpu_target(repo: Path) -> Path:
    manifest_path = repo / "trtpipe.json"
    manifest = json.loads(manifest_path.read_text())
    manifest.update(reference=False, target="h100-sxm")
    manifest_path.write_text(json.dumps(manifest))
    return repo


def test_print_command_is_the_command_serve_print_prints(repo_copy: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """The library's docker command for a GPU target is exactly the line `serve --print` prints, on upstream's
    ports where none is asked for; the judgement (no policy: unverified) is heard before it is returned, and the
    CLI words it as the warning on stderr."""
    repo = _gpu_target(repo_copy)
    heard: list[ContentCheck] = []
    printed = print_command(Workspace(tmp_path / "home", settings=Settings()), ServeRequest(repo=repo, grpc_port=8101),
                            trust=None, on_checked=heard.append)
    assert heard == [printed.content]
    assert printed.content == ContentCheck(repo=repo, judged=None, unverified="no trust policy is set")
    command = printed.command
    assert command[:2] == ["docker", "run"] and command[command.index("--name") + 1] == "trtpipe-unstored-8101"
    assert "127.0.0.1:8101:8101" in command and "127.0.0.1:8000:8000" in command and "127.0.0.1:8002:8002" in command
    assert f"{printed.serving_dir}:/trtpipe/repo:ro" in command and printed.serving_dir.is_dir()

    assert main(["serve", str(repo), "--print", "--grpc-port", "8101"]) == 0
    out = capsys.readouterr()
    assert out.out.strip() == shlex.join(command)
    assert out.err.strip() == (f"warning: serving unverified content: no trust policy is set, so nothing checked "
                               f"that {repo} is what was signed (set TRTPIPE_POLICY or --policy to require it)")


def test_print_command_refuses_a_cpu_reference_repository(example_repo: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A cpu-reference repository has no container command: the library says so without naming the CLI (exit 2),
    after the judgement; the CLI's refusal names its option, as before."""
    heard: list[ContentCheck] = []
    with pytest.raises(NotAContainerTarget) as caught:
        print_command(Workspace(tmp_path / "home", settings=Settings()), ServeRequest(repo=example_repo), trust=None,
                      on_checked=heard.append)
    assert caught.value.exit_code == 2 and str(example_repo) in caught.value.message
    assert "trtpipe " not in (caught.value.fix or "") and "--" not in (caught.value.fix or "")
    assert [c.unverified for c in heard] == ["no trust policy is set"]
    assert not (tmp_path / "home").exists()  # nothing prepared, nothing recorded

    assert main(["serve", str(example_repo), "--print"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --print is for GPU targets (a docker command)")
    assert f"run `trtpipe serve {example_repo}` without --print to start the CPU reference server" in err


def test_restart_is_a_literal_of_the_request() -> None:
    """The CLI refuses anything else naming --restart (tests/serving/test_serve_ci.py); the request itself holds
    only what the watch can do."""
    from pydantic import ValidationError

    assert ServeRequest(repo=Path("r"), restart="on-failure").restart == "on-failure"
    with pytest.raises(ValidationError):
        ServeRequest(repo=Path("r"), restart="always")  # type: ignore[arg-type]


def test_serve_runs_the_watched_server_until_stopped(example_repo: Path, tmp_path: Path) -> None:
    """The library serve the CLI calls: the judgement first, then the watch's events (ready, stopped) until
    `stop` is set; the outcome says what was checked and where the (kept) log is."""
    from trtpipe.serving.watch import ServerReady, ServerStopped

    stop = threading.Event()
    order: list[str] = []

    def on_event(event: object) -> None:
        order.append(type(event).__name__)
        if isinstance(event, ServerReady):
            stop.set()

    log = tmp_path / "server.log"
    outcome = serve(Workspace(tmp_path / "home", settings=Settings()),
                    ServeRequest(repo=example_repo, probe_interval=0, start_timeout=180, log_file=str(log)),
                    trust=None, on_event=on_event, stop=stop,
                    on_checked=lambda content: order.append(f"checked: {content.unverified}"))
    assert order == ["checked: no trust policy is set", "ServerReady", "ServerStopped"]
    assert outcome.content.unverified == "no trust policy is set" and outcome.content.judged is None
    assert isinstance(outcome.stopped, ServerStopped) and not outcome.stopped.failed
    assert outcome.stopped.log == str(log) and outcome.stopped.log_kept and log.is_file()
