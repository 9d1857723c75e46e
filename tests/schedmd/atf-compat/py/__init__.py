"""``py`` for Slurm 22.05's testsuite where the py library is gone (Debian 13 and later):
its conftest imports ``py.io.TerminalWriter``, and pytest 8 keeps only ``py.path`` and
``py.error`` (its own ``py.py`` shim, which this package stands in for). On the guard's
PYTHONPATH only where ``import py.io`` fails (tests/schedmd/guard.py, atf_env)."""

import sys

import _pytest._py.error as error
import _pytest._py.path as path

sys.modules.setdefault("py.error", error)
sys.modules.setdefault("py.path", path)

# ``py.io`` is imported when asked for (the conftest's ``from py.io import ...``): pytest
# imports ``py`` while its own ``_pytest._io`` is still loading.
__all__ = ["error", "path"]
