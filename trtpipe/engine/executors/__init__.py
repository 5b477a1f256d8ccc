"""Executors run a build plan somewhere: `local` (this host), `docker` (the pinned container), `reference` (CPU)."""

from trtpipe.engine.executors.base import BuildFailed, Executor, ExecutorResult

__all__ = ["BuildFailed", "Executor", "ExecutorResult"]
