"""A project's test helpers: its rank base, re-exported (as torchao.testing.utils)."""

from .bases import ProjectRankBase

__all__ = ["ProjectRankBase"]
