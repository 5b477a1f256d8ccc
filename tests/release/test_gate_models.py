"""The gate models live in the release area (trtpipe.release.gate_models) and the spec embeds them: loading them
loads nothing else of trtpipe, and as the spec's `release:` section they refuse what a spec section refuses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from trtpipe import spec
from trtpipe.release import gate_models
from trtpipe.release.gate_models import BenchGate, ChannelGates, ReleaseSection


def test_loading_the_gate_models_loads_no_other_trtpipe_module() -> None:
    script = ("import json, sys\nimport trtpipe.release.gate_models\n"
              "print(json.dumps(sorted(m for m in sys.modules if m.startswith('trtpipe') or m in ('yaml', 'requests'))))")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-800:]
    assert json.loads(done.stdout) == ["trtpipe", "trtpipe.release", "trtpipe.release.gate_models"]


def test_the_spec_embeds_the_release_areas_models() -> None:
    assert spec.BuildSpec.model_fields["release"].annotation is ReleaseSection
    assert gate_models.CPU_REFERENCE == spec.CPU_REFERENCE
    built = spec.BuildSpec.model_validate({"model": {"path": "/models/tiny"},
                                           "release": {"gates": {"prod": {"bench": {"ttft_p99_ms": 500}}}}})
    assert built.release.gates["prod"] == ChannelGates(bench=BenchGate(ttft_p99_ms=500))


def test_the_gate_models_refuse_unknown_keys_and_bad_assignments() -> None:
    with pytest.raises(ValidationError, match="smokee"):
        ReleaseSection.model_validate({"gates": {"prod": {"smokee": True}}})
    with pytest.raises(ValidationError, match="ttft_p99"):
        BenchGate(ttft_p99=5)  # type: ignore[call-arg]
    gates = ChannelGates()
    with pytest.raises(ValidationError, match="less than or equal to 100"):
        gates.max_regression_pct = 200
    with pytest.raises(ValidationError, match="greater than 0"):
        BenchGate().e2e_p99_ms = 0
    assert ChannelGates().smoke is True and ChannelGates().parity is False
