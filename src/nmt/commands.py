"""The console commands of pyproject.toml (``nmt-train``, ``nmt-translate``, ...): each runs
``scripts/<name>.py`` as ``python scripts/<name>.py`` would, so a command is written once, in its script.

They need the source tree, as an editable install (``pip install -e .``, what scripts/setup.sh does)
has it: a wheel installed elsewhere holds neither ``scripts/`` nor ``configs/``.
"""

from __future__ import annotations

import runpy
import sys
from collections.abc import Callable
from pathlib import Path

SCRIPTS_DIR = Path(__file__).resolve().parents[2] / "scripts"


def _command(name: str) -> Callable[[], None]:
    def run() -> None:
        script = SCRIPTS_DIR / f"{name}.py"
        if not script.is_file():
            print(
                f"error: no {script}: nmt-{name.replace('_', '-')} runs the source tree's scripts; "
                "install it editable (pip install -e .)",
                file=sys.stderr,
            )
            sys.exit(1)
        runpy.run_path(str(script), run_name="__main__")

    run.__name__ = run.__qualname__ = name
    run.__doc__ = f"``nmt-{name.replace('_', '-')}``: scripts/{name}.py"
    return run


average_checkpoints = _command("average_checkpoints")
benchmark = _command("benchmark")
benchmark_ct2 = _command("benchmark_ct2")
benchmark_decoders = _command("benchmark_decoders")
benchmark_prepare = _command("benchmark_prepare")
benchmark_server = _command("benchmark_server")
build_shortlist = _command("build_shortlist")
compare_alignments = _command("compare_alignments")
distill = _command("distill")
evaluate = _command("evaluate")
export_ct2 = _command("export_ct2")
export_hf = _command("export_hf")
plot_attention = _command("plot_attention")
pipeline = _command("pipeline")
plot_curves = _command("plot_curves")
prepare_data = _command("prepare_data")
score = _command("score")
select_final = _command("select_final")
serve = _command("serve")
sweep_summary = _command("sweep_summary")
train = _command("train")
translate = _command("translate")
