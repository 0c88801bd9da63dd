"""Rules of the repository's shape that a review would otherwise have to remember."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


@pytest.mark.slow
def test_no_test_file_imports_another() -> None:
    """What two test files share lives in tests/support/ (or conftest.py)."""
    offenders = []
    for path in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            offenders += [
                f"{path.relative_to(TESTS)}:{node.lineno} imports {n}"
                for n in names
                if n.split(".")[-1].startswith("test_")
            ]
    assert offenders == []
