"""Provenance: an in-toto statement (v1) with a SLSA provenance predicate (v1) for one stored artifact.

    subject                 the artifact: "<kind>/<key>", digest sha256 = the artifact digest
    buildDefinition
      buildType             BUILD_TYPE (trtpipe's build, this statement's version)
      externalParameters    the spec as loaded (from the build record), its path, the artifact's key document
      internalParameters    the toolchain (pinned versions, container), installed versions
      resolvedDependencies  every input digest the key documents name (weights, config, tokenizer,
                            calibration set, the stored stages it was built from), and every stage's key
                            and artifact digest from the build record
    runDetails
      builder.id            the host that built it: "urn:trtpipe:builder:<host>" (the signer says who vouches)
      metadata              the build record's id and start/finish times
      byproducts            the build record itself

The key documents are the artifact's own (manifest.json `inputs`), so the digests named are exactly those
its key was computed from; the build record adds what the key leaves out (who, where, when, versions).
An artifact without a build record in this store (pulled, or built elsewhere) gets a statement from its
key documents alone, and says so (`runDetails.metadata.invocationId` is null).
Specs: in-toto Statement v1 (https://in-toto.io/Statement/v1), SLSA Provenance v1 (https://slsa.dev/provenance/v1).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from trtpipe.workspace import Workspace

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "urn:trtpipe:buildType:build:v1"
_HEX64 = re.compile(r"^(sha256:)?([0-9a-f]{64})$")


def _digests_in(node: Any, path: str, out: list[dict[str, Any]]) -> None:
    """Every sha256 a key document names, labelled by where: the input files' digests (model.config,
    model.weights[i], tokenizer, calibration, templates) and the stored stages it was built on (checkpoint,
    engine.digest). A key document holds no other 64-hex value."""
    if isinstance(node, dict):
        for name, value in sorted(node.items()):
            _digests_in(value, f"{path}.{name}" if path else str(name), out)
    elif isinstance(node, list):
        for index, item in enumerate(node):
            _digests_in(item, f"{path}[{index}]", out)
    elif isinstance(node, str):
        match = _HEX64.match(node)
        if match:
            out.append({"name": path, "digest": {"sha256": match.group(2)}})


def statement(workspace: Workspace, entry: Any) -> dict[str, Any]:
    """The provenance statement of `entry` (an `Entry` of the workspace's store, trtpipe.store.local), from the
    build records kept in the workspace."""
    from trtpipe.build_record import records_for_digest

    records = records_for_digest(workspace.root, entry.digest)
    record = records[0] if records else None
    dependencies: list[dict[str, Any]] = []
    _digests_in(entry.inputs, f"{entry.kind}.inputs", dependencies)
    if record is not None:
        # The key documents of every stage the build stored (weights, config, calibration set, tokenizer ...).
        from trtpipe.errors import TrtpipeError

        store = workspace.store
        for kind, digest in sorted(record.artifacts.items()):
            if digest == entry.digest:
                continue
            try:
                stage_entry = store.find(digest)
            except TrtpipeError:
                continue  # gone from this store: its digest is still named below
            _digests_in(stage_entry.inputs, f"{kind}.inputs", dependencies)
        for stage in record.stages:
            if stage.digest and _HEX64.match(stage.digest):
                dependencies.append({"name": f"stage.{stage.name}", "digest": {"sha256": _HEX64.match(stage.digest).group(2)},
                                     "annotations": {"key": stage.key, "outcome": stage.outcome}})
    seen: set[tuple[str, str]] = set()
    unique = []
    for item in dependencies:
        marker = (item["name"], item["digest"]["sha256"])
        if marker not in seen:
            seen.add(marker)
            unique.append(item)
    record_json = record.model_dump(mode="json") if record is not None else None
    byproducts = []
    if record_json is not None:
        body = json.dumps(record_json, sort_keys=True, separators=(",", ":")).encode("utf-8")
        byproducts.append({"name": f"build-record/{record.id}.json", "digest": {"sha256": hashlib.sha256(body).hexdigest()},
                           "mediaType": "application/json", "annotations": {"record": record_json}})
    builder: dict[str, Any] = {"id": f"urn:trtpipe:builder:{record.host}" if record is not None else "urn:trtpipe:builder:unknown"}
    if record is not None and record.versions.get("trtpipe"):
        builder["version"] = {"trtpipe": str(record.versions["trtpipe"])}
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": f"{entry.kind}/{entry.key}", "digest": {"sha256": entry.digest.removeprefix("sha256:")}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {
                    "spec": record.spec if record is not None else None,
                    "spec_path": record.spec_path if record is not None else None,
                    "key_document": entry.inputs,
                },
                "internalParameters": {
                    "toolchain": record.toolchain if record is not None else entry.inputs.get("toolchain"),
                    "versions": record.versions if record is not None else {},
                    "stage_keys": dict(record.keys) if record is not None else {},
                },
                "resolvedDependencies": unique,
            },
            "runDetails": {
                "builder": builder,
                "metadata": {
                    "invocationId": record.id if record is not None else None,
                    "startedOn": record.started_at if record is not None else None,
                    "finishedOn": record.finished_at if record is not None else None,
                },
                "byproducts": byproducts,
            },
        },
    }

