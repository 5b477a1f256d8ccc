"""The identity a served model reports: which artifact a Triton server actually serves.

Three `parameters` in every model's config.pbtxt (Triton reports them over gRPC in the model config):
    trtpipe_engine_digest       written by publish: the engine artifact the repository embeds
    trtpipe_repository_key      written by publish: the repository's store key
    trtpipe_repository_digest   written by `trtpipe serve` into its serving copy: the repository's
                                artifact digest (it cannot sit inside the content it is the digest of)
Results (smoke, parity, bench) are recorded under the repository digest the server reports, never
under what a command line claims: that is the one key `promote` reads.

Unknown `parameters` are harmless: our Python models read theirs by name, the ensemble scheduler
ignores them, and the TensorRT-LLM C++ backend looks up each parameter it knows by name with
`ModelState::GetParameter<std::string>` and never lists the rest (tensorrtllm_backend tag v0.19.0,
inflight_batcher_llm/src/model_state.cc:249; the same function in NVIDIA/TensorRT-LLM
triton_backend/inflight_batcher_llm/src/model_state.cc at commit 5cdd6921, where the backend lives
from v0.20 on). Verified on the CPU tritonserver here: a config with these parameters loads, and
get_model_config reports them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from trtpipe.errors import IntegrityError, NotFound, UsageError

ENGINE_DIGEST = "trtpipe_engine_digest"
REPOSITORY_KEY = "trtpipe_repository_key"
REPOSITORY_DIGEST = "trtpipe_repository_digest"
# Written by `trtpipe serve` beside the repository digest: a random token naming this serve, kept in its serving
# directory's lock file with the digest it verified (trtpipe.store.serving_dirs.write_serve_record). A server
# that reports a digest without a live serve's token was not started by a serve that checked its bytes.
SERVE_TOKEN = "trtpipe_serve_token"
IDENTITY_PARAMETERS = (ENGINE_DIGEST, REPOSITORY_KEY, REPOSITORY_DIGEST, SERVE_TOKEN)

if TYPE_CHECKING:
    from trtpipe.store.local import Store

_SAFE_VALUE = re.compile(r"^[A-Za-z0-9:._-]*$")


def parameter_block(values: dict[str, str]) -> str:
    """config.pbtxt text for `values` as string parameters, one line each, in a stable order."""
    lines = []
    for key in sorted(values):
        value = values[key]
        if not _SAFE_VALUE.match(value):  # digests and keys only: nothing that needs quoting
            raise ValueError(f"identity value {value!r} is not a digest or key")
        lines.append(f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}')
    return "\n".join(lines) + "\n"


def add_parameters(config_text: str, values: dict[str, str], *, where: str) -> str:
    """`config_text` with `values` appended as parameters; refuses one that is already there."""
    for key in values:
        if re.search(rf'key:\s*"{re.escape(key)}"', config_text):
            raise IntegrityError(f"{where} already sets the parameter {key} (identity parameters are never hand-edited)",
                                 path=where, fix="publish the repository again")
    if not config_text.endswith("\n"):
        config_text += "\n"
    return config_text + parameter_block(values)


class ServedIdentity(BaseModel):
    """What the models of a running server report (None: a model without that parameter)."""

    repository_digest: str | None
    repository_key: str | None
    engine_digest: str | None
    models: list[str]
    serve_token: str | None = Field(default=None, exclude=True)  # never filed with a result

    def describe(self) -> str:
        return self.repository_digest or "no trtpipe_repository_digest"


def read_served_identity(url: str, *, timeout: float = 30) -> ServedIdentity:
    """Ask the server at `url` (gRPC) for every model's identity parameters; they must all agree."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    try:
        try:
            index = client.get_model_repository_index(as_json=True, client_timeout=timeout).get("models", [])
        except Exception as err:  # unreachable server, or not Triton: one line from tritonclient
            raise NotFound(f"cannot ask {url} what it serves: {str(err).splitlines()[0] if str(err) else err}",
                           what="server", ref=url, fix="start the server first and give its gRPC address") from None
        # A folder the server never loaded (explicit model control) is listed too, without a state.
        names = sorted({m["name"] for m in index if m.get("state") == "READY"})
        seen: dict[str, dict[str, str | None]] = {}
        for name in names:
            config = client.get_model_config(name, as_json=True, client_timeout=timeout).get("config", {})
            params = config.get("parameters", {}) or {}
            seen[name] = {k: (params.get(k) or {}).get("string_value") or None for k in IDENTITY_PARAMETERS}
    finally:
        client.close()
    values: dict[str, str | None] = {}
    for key in IDENTITY_PARAMETERS:
        distinct = {v[key] for v in seen.values()}
        if len(distinct) > 1:
            detail = ", ".join(f"{m}={v[key]}" for m, v in sorted(seen.items()))
            raise UsageError(f"the models at {url} disagree on {key} ({detail}): one server, several artifacts",
                             fix="serve one published repository per server")
        values[key] = distinct.pop() if distinct else None
    return ServedIdentity(repository_digest=values[REPOSITORY_DIGEST], repository_key=values[REPOSITORY_KEY],
                          engine_digest=values[ENGINE_DIGEST], models=list(seen), serve_token=values[SERVE_TOKEN])


class RecordTarget(BaseModel):
    """What `--record REPO` files a result under: REPO's artifact digest (and the target it was built for)."""

    digest: str
    kind: str
    key: str
    target: str | None
    store_root: str = ""  # the store that holds it: where a live serve of it keeps its serve record


def record_target(repo: Path, store: Store) -> RecordTarget:
    """The repository artifact `repo` names; it must be an entry of `store` (the workspace's), where the
    results go and where promote looks for the artifact."""
    from trtpipe.store.local import MANIFEST, Store

    found = Store.holding(Path(repo))
    if found is None or found[1].kind != "repository":
        raise UsageError(f"{repo} is not a repository in a trtpipe store (no {MANIFEST})",
                         fix="give the repository path the build printed (repository_path in its JSON report)")
    holder, entry = found
    if holder.root.resolve() != Path(store.root).expanduser().resolve():
        raise UsageError(f"{repo} is an artifact of the store {holder.root}, not of this workspace's store {store.root}; "
                         "nothing recorded", fix=f"record into the store that holds it ({holder.root})")
    if not entry.current:
        raise UsageError(f"{repo} was written by an older trtpipe (no current manifest)",
                         fix="rebuild it from its spec, then serve the new repository")
    target = (entry.inputs.get("target") or {}).get("gpu")
    return RecordTarget(digest=entry.digest, kind=entry.kind, key=entry.key, target=target, store_root=str(holder.root))


def check_recording(identity: ServedIdentity, wanted: RecordTarget, url: str, repo: Path) -> None:
    """Refuse (one line, UsageError) to record for `wanted` unless the server says it serves exactly that."""
    if identity.repository_digest is None:
        raise UsageError(
            f"refused to record: the server at {url} reports no {REPOSITORY_DIGEST}, so what it serves is unknown; "
            "nothing recorded",
            fix=f"serve {repo} through trtpipe (it writes the identity into the serving copy)",
        )
    if identity.repository_digest != wanted.digest:
        raise UsageError(
            f"refused to record: the server at {url} serves {identity.repository_digest}, not {repo} "
            f"({wanted.digest}); nothing recorded",
            fix="record for the repository that server serves, or serve this one",
        )
    # The digest is only what the server's configs say. Recorded only when a live `trtpipe serve` from this store
    # put it there, after checking every byte it serves against that digest's manifest (serving_dir.prepare):
    # a server someone started on a folder whose configs claim the digest has no such serve's token.
    from trtpipe.store.serving_dirs import live_serve_record

    record = live_serve_record(Path(wanted.store_root), identity.serve_token or "") if wanted.store_root else None
    if record is None or record.get("digest") != wanted.digest:
        raise UsageError(
            f"refused to record: the server at {url} says it serves {wanted.digest}, but no live `trtpipe serve` of "
            f"{repo} verified the bytes it serves (its {SERVE_TOKEN} names no serve in "
            f"{wanted.store_root or 'the store'}); "
            "nothing recorded",
            fix=f"serve {repo} through trtpipe's own serve (it checks every file against the digest) and record "
                "against that server",
        )
