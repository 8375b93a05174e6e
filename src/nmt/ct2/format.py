"""What the CTranslate2 exporter writes and the CTranslate2 backend reads besides the model itself:
the ``ctranslate2`` import (an optional dependency) and ``nmt_export.json``, the export's metadata (the
tokenizer's fingerprint, so a backend can refuse a tokenizer that does not match; the positions).
Shared by both so that the backend does not depend on the exporter (nor on the Transformer's internals).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import ModuleType
from typing import Any

from nmt.errors import NMTError

META_FILE = "nmt_export.json"


def require_ctranslate2() -> ModuleType:
    """The ``ctranslate2`` module, or an NMTError saying how to install it."""
    try:
        import ctranslate2
    except ImportError:
        raise NMTError(
            "CTranslate2 is not installed: pip install 'ctranslate2>=4.5' (or the project's [ct2] extra)"
        ) from None
    return ctranslate2


def write_export_info(model_dir: Path, info: dict[str, Any]) -> None:
    (model_dir / META_FILE).write_text(json.dumps(info, indent=2) + "\n")


def read_export_info(model_dir: str | Path) -> dict[str, Any]:
    """``nmt_export.json`` of an exported model; an NMTError when ``model_dir`` is not one."""
    path = Path(model_dir) / META_FILE
    if not path.is_file():
        raise NMTError(
            f"{model_dir}: not a model directory written by scripts/export_ct2.py (no {META_FILE})"
        )
    return json.loads(path.read_text())


def file_digest(path: Path) -> str:
    """The SHA-256 of a file's content: how an export names the shortlist its vocabulary map came from."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
