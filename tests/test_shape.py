"""Each room one idea, in a size a reader takes in at once: no function or method of the
product over 60 lines, no class over 400, counted from ``def`` or ``class`` to the last
line (docstrings included; a click command's option decorators are its signature and are
not counted)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("coda_common", "coda_node", "slurm_plugin")
MAX_FUNCTION_LINES = 60
MAX_CLASS_LINES = 400


def _too_long() -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    limit, what = MAX_FUNCTION_LINES, "function"
                elif isinstance(node, ast.ClassDef):
                    limit, what = MAX_CLASS_LINES, "class"
                else:
                    continue
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > limit:
                    where = path.relative_to(ROOT)
                    found.append(f"{where}:{node.lineno} {what} {node.name}: {lines} lines")
    return found


def test_no_function_over_60_lines_and_no_class_over_400() -> None:
    assert _too_long() == []
