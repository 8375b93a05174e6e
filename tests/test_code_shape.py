"""Every function of the package fits on a screen: at most 60 lines from its ``def`` to its end."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "nmt"
MAX_LINES = 60


def long_functions(source: str, name: str) -> list[str]:
    """``name:line function (n lines)`` for each function of ``source`` (nested ones too) over
    MAX_LINES lines, decorators left out."""
    found = []
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_LINES:
                found.append(f"{name}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_of_the_package_is_longer_than_a_screen():
    found = [
        entry
        for path in sorted(PACKAGE.rglob("*.py"))
        for entry in long_functions(path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE)))
    ]
    assert not found, f"functions over {MAX_LINES} lines: split them into named steps:\n" + "\n".join(found)


def function(name: str, lines: int, indent: str = "") -> str:
    """The source of a function ``lines`` lines long."""
    return f"{indent}def {name}():\n" + "".join(f"{indent}    x{i} = {i}\n" for i in range(lines - 1))


def test_a_function_one_line_too_long_is_named_nested_or_not():
    source = (
        function("fits", MAX_LINES)
        + "class A:\n    def method(self):\n"
        + function("inner", MAX_LINES + 1, indent="        ")
    )
    line = MAX_LINES + 2  # the method's def
    assert long_functions(source, "x.py") == [
        f"x.py:{line} method ({MAX_LINES + 2} lines)",
        f"x.py:{line + 1} inner ({MAX_LINES + 1} lines)",
    ]
