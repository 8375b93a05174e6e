"""Progress bars in a log file: a preparation whose stderr is redirected redraws its bars about once a
minute, as training's bar does, not once per chunk of pairs."""

import io
import itertools
import sys

import tqdm.std

from nmt.config import LocalDataConfig
from nmt.data import prepare_text


def test_a_redirected_preparation_redraws_its_bars_rarely(tmp_path, monkeypatch):
    pairs = 45_000  # five chunks of the local reader
    for prefix, n in (("train", pairs), ("valid", 2), ("test", 2)):
        for lang in ("en", "de"):
            (tmp_path / f"{prefix}.{lang}").write_text("".join(f"{lang} {i} w\n" for i in range(n)))
    clock = itertools.count(step=5.0)  # five seconds pass at every look at the clock
    monkeypatch.setattr(tqdm.std, "time", lambda: next(clock))
    log = io.StringIO()  # not a terminal, like a log file
    monkeypatch.setattr(sys, "stderr", log)
    cfg = LocalDataConfig(dir=str(tmp_path), name="corpus", cache_dir=str(tmp_path / "data"))
    prepare_text(cfg, progress=True)
    draws = log.getvalue().count("reading train")
    assert 1 <= draws <= 3, log.getvalue()  # its start, perhaps one minute's redraw, its end
