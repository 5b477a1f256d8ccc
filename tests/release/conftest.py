"""Fixtures for the release tests: an isolated home, store entries, the CLI, and a token-auth registry.

The htpasswd registry (`registry`, `RegistryHandle`) lives in tests/conftest.py: the store tests use it too.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HOME, DOCKER_CONFIG and TRTPIPE_HOME isolated: a user's ~/.docker/config.json must not leak in."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("DOCKER_CONFIG", raising=False)
    for var in ("TRTPIPE_REGISTRY_USERNAME", "TRTPIPE_REGISTRY_PASSWORD", "ORAS_USER", "ORAS_PASS", "GITHUB_ACTOR", "GITLAB_USER_LOGIN"):
        monkeypatch.delenv(var, raising=False)
    store = tmp_path / "trtpipe-home"
    store.mkdir()
    monkeypatch.setenv("TRTPIPE_HOME", str(store))
    monkeypatch.setenv("TRTPIPE_USER", "release-tester")
    return store


@pytest.fixture
def registry_env(registry: Any, isolated_home: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Credentials for the test registry through the environment."""
    monkeypatch.setenv("TRTPIPE_REGISTRY_USERNAME", registry.username)
    monkeypatch.setenv("TRTPIPE_REGISTRY_PASSWORD", registry.password)
    return registry





def make_store_entry(home: Path, key: str, *, seed: str = "a", kind: str = "engine", model: str = "tiny-llama",
                     target: str = "cpu-reference", gates: dict[str, Any] | None = None,
                     release: dict[str, Any] | None = None):
    """Commit a small artifact into the real local store under `home`.

    Its key document records the name and target it is promoted under, as a repository's does
    (`inputs.name`, `inputs.target.gpu`); with `gates` (or a whole `release` section, as
    `spec.release.model_dump()` gives it) also the release gates promote reads.
    """
    from trtpipe.store.local import Store

    store = Store.open(home)
    with store.building(kind, key) as b:
        if b.existing is not None:
            return b.existing
        (b.dir / "config.json").write_text(json.dumps({"trtpipe_reference": True, "seed": seed}))
        (b.dir / "rank0.safetensors").write_bytes((seed * 50000).encode())
        (b.dir / "tokenizer").mkdir()
        (b.dir / "tokenizer" / "tokenizer.json").write_text("{}")
        inputs: dict[str, Any] = {"seed": seed, "name": model, "target": {"gpu": target}, "toolchain": "trtllm-1.2.1"}
        if gates is not None:
            inputs["release"] = {"gates": gates}
        if release is not None:
            inputs["release"] = release
        return b.commit(inputs=inputs)


def run_cli(*args: str) -> tuple[int, str, str]:
    """Run the CLI in-process; return (exit code, stdout, stderr)."""
    import contextlib
    import io

    from trtpipe.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def store_entry():
    """make_store_entry(home, key, seed=..., model=..., target=..., gates=..., release=...) -> Entry."""
    return make_store_entry


@pytest.fixture
def cli():
    """run_cli(*args) -> (exit code, stdout, stderr)."""
    return run_cli


# --------------------------------------------------------------------------- token-auth registry
# GHCR, ECR, Docker Hub and Harbor answer /v2/ with a Bearer challenge and hand out tokens from a
# token service. The distribution registry does the same with `auth.token`; the token service below
# follows the Docker token spec (RS256 JWT with an x5c chain the registry checks against its root
# bundle), signing with the openssl CLI.


TOKEN_USER = "trtpipe-ci"
TOKEN_PASSWORD = "s3cret-Token-Pw-2c9d"


def _b64url(data: bytes) -> str:
    import base64

    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class _TokenService:
    def __init__(self, base: Path, username: str, password: str, service: str, issuer: str) -> None:
        self.key = base / "token-key.pem"
        self.cert = base / "token-cert.pem"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(self.key), "-out", str(self.cert),
             "-days", "2", "-subj", "/CN=trtpipe-test-token"],
            check=True, capture_output=True,
        )
        der = subprocess.run(["openssl", "x509", "-in", str(self.cert), "-outform", "DER"], check=True, capture_output=True).stdout
        import base64

        self.x5c = base64.b64encode(der).decode()
        self.username, self.password, self.service, self.issuer = username, password, service, issuer
        self.requests = 0

    def sign(self, scope: str | None) -> str:
        import uuid

        now = int(time.time())
        access = []
        if scope:
            kind, name, actions = scope.split(":", 2)
            access.append({"type": kind, "name": name, "actions": actions.split(",")})
        header = {"typ": "JWT", "alg": "RS256", "x5c": [self.x5c]}
        claims = {"iss": self.issuer, "sub": self.username, "aud": self.service, "exp": now + 300, "nbf": now - 10,
                  "iat": now, "jti": uuid.uuid4().hex, "access": access}
        signing_input = f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
        signature = subprocess.run(["openssl", "dgst", "-sha256", "-sign", str(self.key)], input=signing_input.encode(),
                                   check=True, capture_output=True).stdout
        return f"{signing_input}.{_b64url(signature)}"

    def serve(self):
        import base64
        import threading
        import urllib.parse
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        service = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def do_GET(self) -> None:  # noqa: N802
                service.requests += 1
                expected = "Basic " + base64.b64encode(f"{service.username}:{service.password}".encode()).decode()
                if self.headers.get("Authorization") != expected:
                    self.send_response(401)
                    self.end_headers()
                    return
                query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
                token = service.sign((query.get("scope") or [None])[0])
                body = json.dumps({"token": token, "access_token": token, "expires_in": 300}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        return server


@pytest.fixture(scope="session")
def token_registry(tmp_path_factory: pytest.TempPathFactory, serve_registry):
    """docker-registry with Bearer-token auth (like GHCR/ECR/Docker Hub) and its token service."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed (the test token service signs with it)")
    base = tmp_path_factory.mktemp("token-registry")
    tokens = _TokenService(base, TOKEN_USER, TOKEN_PASSWORD, "trtpipe-test-registry", "trtpipe-test-issuer")
    server = tokens.serve()
    auth = ["  token:", f"    realm: http://127.0.0.1:{server.server_address[1]}/token",
            f"    service: {tokens.service}", f"    issuer: {tokens.issuer}", f"    rootcertbundle: {tokens.cert}"]
    try:
        with serve_registry(base, auth, TOKEN_USER, TOKEN_PASSWORD) as handle:
            yield handle
    finally:
        server.shutdown()
