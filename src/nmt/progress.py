"""Progress bars that suit where stderr goes: a terminal gets a live bar, a log file (a redirected or
``nohup`` run) a redraw a minute, so that a long job's log is not thousands of copies of one line."""

from __future__ import annotations

import sys
from typing import Any

from tqdm.auto import tqdm

# Seconds between two redraws of a bar whose stderr is not a terminal: a redraw per minute instead of
# ten per second; the log lines say the rest.
REDIRECTED_REFRESH_S = 60.0


def refresh_interval() -> float:
    """tqdm's ``mininterval`` for a bar drawn on stderr now."""
    return 0.1 if sys.stderr.isatty() else REDIRECTED_REFRESH_S


def progress_bar(**kwargs: Any) -> tqdm:
    """A tqdm bar on stderr that redraws as :func:`refresh_interval` says; ``kwargs`` go to tqdm."""
    return tqdm(file=sys.stderr, mininterval=refresh_interval(), **kwargs)
