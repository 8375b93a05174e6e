"""The package's layers (import-linter contracts in pyproject.toml) hold, and a wrong import breaks them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter is not installed")


def lint_imports(src: Path) -> subprocess.CompletedProcess:
    """Check the contracts against the package under ``src`` (first on the path: it shadows the install)."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    return subprocess.run(
        [str(LINT_IMPORTS), str(REPO / "pyproject.toml"), "--no-cache"],
        capture_output=True,
        text=True,
        env=env,
        cwd=src,
        timeout=300,
    )


def test_the_package_keeps_its_layers():
    result = lint_imports(REPO / "src")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("module", "wrong_import", "contract"),
    [
        (
            "training/loss.py",
            "import nmt.inference.translator",
            "nmt.training.loss -> nmt.inference.translator",
        ),
        ("models/base.py", "import nmt.decoding", "nmt.models.base -> nmt.decoding"),
        ("serve/batcher.py", "import nmt.models", "nmt.serve.batcher -> nmt.models"),
        ("decoding/beam.py", "import nmt.data", "nmt.decoding.beam -> nmt.data"),
    ],
)
def test_a_wrong_import_fails_naming_both_modules(tmp_path, module, wrong_import, contract):
    shutil.copytree(REPO / "src" / "nmt", tmp_path / "nmt", ignore=shutil.ignore_patterns("__pycache__"))
    with open(tmp_path / "nmt" / module, "a", encoding="utf-8") as f:
        f.write(f"\n{wrong_import}  # a layer broken on purpose\n")
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    assert contract in result.stdout


def test_no_two_modules_share_a_name():
    """One name, one module: ``decoding`` is the search, not also a benchmark's file."""
    package = REPO / "src" / "nmt"
    names: dict[str, list[str]] = {}
    for path in package.rglob("*.py"):
        if path.name != "__init__.py":
            names.setdefault(path.stem, []).append(str(path.relative_to(package)))
    for path in package.rglob("*/"):
        if (path / "__init__.py").exists():
            names.setdefault(path.name, []).append(str(path.relative_to(package)) + "/")
    shared = {name: paths for name, paths in names.items() if len(paths) > 1}
    assert not shared, shared
