"""The release gates a spec's `release` section declares and an artifact records: pydantic shapes only.

`ReleaseSection` is the spec's `release:` (trtpipe.spec's BuildSpec embeds it); `ChannelGates` is what
promotion into one channel requires, and `BenchGate` its bench SLOs. They live here, beside the gates that
judge them (trtpipe.release.gates), so the release area reads an artifact's recorded gates without loading
the spec module (its toolchain and quantization tables): this module imports nothing but pydantic.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

# The target a bench result recorded without a GPU class counts for (a CPU run): the spec's target name
# (trtpipe.spec.CPU_REFERENCE, held equal by tests/release/test_bench_gates.py), named here so the gates'
# judge reads it without loading the spec.
CPU_REFERENCE = "cpu-reference"


class _GateModel(BaseModel):
    """As every spec section: unknown keys are refused, values are validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)


class BenchGate(_GateModel):
    """SLOs a bench result must meet (milliseconds)."""

    ttft_p99_ms: float | None = Field(default=None, gt=0)
    tpot_p99_ms: float | None = Field(default=None, gt=0)
    e2e_p99_ms: float | None = Field(default=None, gt=0)
    min_output_tokens_per_s: float | None = Field(default=None, gt=0)


class ChannelGates(_GateModel):
    """What promotion into one channel requires."""

    smoke: bool = True
    parity: bool = False
    bench: BenchGate | None = None
    max_regression_pct: float | None = Field(default=None, ge=0, le=100)


class ReleaseSection(_GateModel):
    gates: dict[str, ChannelGates] = Field(default_factory=dict)
