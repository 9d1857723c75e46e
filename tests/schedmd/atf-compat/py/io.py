"""``py.io.TerminalWriter``, which pytest keeps as ``_pytest._io.TerminalWriter``."""

from _pytest._io import TerminalWriter

__all__ = ["TerminalWriter"]
