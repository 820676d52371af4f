"""Alias of :mod:`kvferry.procs` (process helpers for tests)."""

from .procs import Master, Node, ProcessError, Target

__all__ = ["Master", "Node", "Target", "ProcessError"]
