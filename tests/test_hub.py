"""The default data config (data=wmt14_de_en, no data_files) against a stand-in for the Hugging Face hub:
what it fetches, the commit every request names, the cache keyed by that commit, the preset's fallback,
failures in one line, a quiet log."""

import io
import logging
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hub_standin import OTHER, PINNED, ROW_GROUP, TRAIN_ROWS, VALID_ROWS, standin_hub

from nmt.config import check_train_config
from nmt.data import prepare_text
from nmt.data.sources import load_source
from nmt.errors import NMTError

REPO = Path(__file__).resolve().parents[1]
TRAIN_FILES = [f"de-en/train-{i:05d}-of-00003.parquet" for i in range(3)]


@pytest.fixture
def hub(tmp_path, monkeypatch):
    yield from standin_hub(tmp_path, monkeypatch)


def default_data(compose_train_cfg, tmp_path, *overrides: str):
    """``scripts/train.py``'s data config as a user gets it: the default data=wmt14_de_en."""
    data = compose_train_cfg(f"data.cache_dir={tmp_path / 'data'}", *overrides).data
    assert (data.source, data.path, data.config_name, data.data_files) == ("hf", "wmt/wmt14", "de-en", None)
    return data


def spans(content: bytes) -> list[tuple[int, int]]:
    """The byte range of each row group of a parquet file."""
    metadata = pq.read_metadata(io.BytesIO(content))
    out = []
    for g in range(metadata.num_row_groups):
        columns = [metadata.row_group(g).column(c) for c in range(metadata.row_group(g).num_columns)]
        starts = [c.dictionary_page_offset if c.has_dictionary_page else c.data_page_offset for c in columns]
        out.append((min(starts), max(s + c.total_compressed_size for s, c in zip(starts, columns))))
    return out


def footer_bytes(content: bytes) -> int:
    return int.from_bytes(content[-8:-4], "little") + 8


def fetched_ranges(standin, path: str) -> list[tuple[int, int]]:
    """The byte ranges (end exclusive) asked of ``path`` with a Range header."""
    out = []
    for r in standin.requests:
        if r.path.endswith("/" + path) and r.range:
            start, end = r.range.removeprefix("bytes=").split("-")
            out.append((int(start), int(end) + 1))
    return out


def test_the_default_draw_fetches_its_row_groups_and_footers_only(hub, compose_train_cfg, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    data = default_data(compose_train_cfg, tmp_path, "data.train_size=1500")
    corpus = load_source(data)
    assert len(corpus["train"]["en"]) == 1500 and len(corpus["valid"]["de"]) == VALID_ROWS

    files = hub.files
    budget = 0
    for path, rows in zip(TRAIN_FILES, TRAIN_ROWS):
        content, groups = files[path], spans(files[path])
        ranges = fetched_ranges(hub, path)
        tail = len(content) - footer_bytes(content)
        body = [(s, e) for s, e in ranges if e <= tail]
        assert sum(e - s for s, e in ranges if s >= tail) == footer_bytes(content)  # the footer, once
        touched = [g for g, (s, e) in enumerate(groups) if any(a <= s and e <= b for a, b in body)]
        starts, ends = {s for s, _ in groups}, {e for _, e in groups}
        for a, b in body:  # whole row groups, one request per run of touching groups, gaps never fetched
            assert a in starts and b in ends
        assert all(b1 < a2 for (_, b1), (a2, _) in zip(sorted(body), sorted(body)[1:]))
        quota = 1500 * rows // sum(TRAIN_ROWS)
        assert len(touched) <= quota // ROW_GROUP + 2  # the groups that hold the file's share
        budget += 1.5 * sum(e - s for g, (s, e) in enumerate(groups) if g in touched) + footer_bytes(content)
    splits = sum(len(c) for p, c in files.items() if "validation" in p or "test" in p)
    parquet = sum(r.body_bytes for r in hub.requests if r.path.endswith(".parquet"))
    assert parquet <= budget + splits, (parquet, budget, splits)
    assert parquet < 0.5 * sum(len(files[p]) for p in TRAIN_FILES) + splits

    # every request names the pinned commit; nothing lands in the Hugging Face caches
    assert all(PINNED in r.path and "/main" not in r.path for r in hub.dataset_requests), hub.requests
    assert {r.path for r in hub.requests} - {r.path for r in hub.dataset_requests} <= {"/api/agent-harnesses"}
    assert {p.name for p in (tmp_path / "hf_home").rglob("*")} <= {".agent_harnesses.json"}
    # one line per file read, naming the commit; no line per HTTP request
    read = [r.getMessage() for r in caplog.records if "rows drawn" in r.getMessage()]
    assert len(read) == 5 and all(f"hf://datasets/wmt/wmt14@{PINNED}/de-en/" in line for line in read)
    assert not [r for r in caplog.records if r.name.startswith(("httpx", "httpcore"))]


def test_the_cache_is_keyed_by_the_commit_and_main_is_resolved_to_one(
    hub, compose_train_cfg, tmp_path, caplog
):
    caplog.set_level(logging.INFO)
    pinned = prepare_text(default_data(compose_train_cfg, tmp_path, "data.train_size=500"), progress=False)
    other = prepare_text(
        default_data(compose_train_cfg, tmp_path, "data.train_size=500", f"data.revision={OTHER}"),
        progress=False,
    )
    assert other != pinned and other.is_dir()
    assert any(OTHER in r.path for r in hub.dataset_requests)
    hub.requests.clear()
    main = prepare_text(
        default_data(compose_train_cfg, tmp_path, "data.train_size=500", "data.revision=main"), progress=False
    )
    assert main == pinned  # main is the pinned commit here: its corpus, not another download
    assert [r.path for r in hub.dataset_requests] == ["/api/datasets/wmt/wmt14/revision/main"]
    assert f"data.revision=main of wmt/wmt14 is commit {PINNED}" in caplog.text


def test_the_subset_preset_without_its_folder_falls_back_through_the_hub(hub, compose_train_cfg, tmp_path):
    data = compose_train_cfg(
        "experiment=wmt14_subset_cpu",
        f"data.dir={tmp_path / 'absent'}",
        f"data.cache_dir={tmp_path / 'data'}",
    ).data
    corpus = load_source(data)
    assert len(corpus["train"]["de"]) == sum(TRAIN_ROWS)  # its 33,071 pairs are more than the stand-in has
    assert len(corpus["test"]["en"]) == VALID_ROWS
    assert hub.dataset_requests and all(PINNED in r.path for r in hub.dataset_requests)
    for path in TRAIN_FILES:  # the whole split: each file once, in one range, plus its footer
        assert sum(e - s for s, e in fetched_ranges(hub, path)) <= len(hub.files[path]) + footer_bytes(
            hub.files[path]
        )


def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.parametrize(
    ("failure", "advice"),
    [
        ("404", "check data.path=wmt/wmt14, data.config_name=de-en and data.revision="),
        ("500", "run again to retry; without internet access use local files"),
        ("stall", "run again to retry; without internet access use local files"),
        ("refused", "run again to retry; without internet access use local files"),
    ],
)
def test_hub_failures_end_in_one_line_naming_the_dataset(
    hub, compose_train_cfg, tmp_path, monkeypatch, failure, advice
):
    import huggingface_hub

    if failure == "404":
        hub.fail_status = 404
    elif failure == "500":
        hub.fail_status = 500
    elif failure == "stall":
        hub.stall = True
    else:
        monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", closed_port())
    data = default_data(compose_train_cfg, tmp_path, "data.hub_timeout_s=1", "data.hub_retries=1")
    started = time.monotonic()
    with pytest.raises(NMTError) as e:
        load_source(data)
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith("could not read Hugging Face dataset wmt/wmt14 (de-en) at revision ")
    assert advice in message
    assert time.monotonic() - started < 15  # a stalled server: two tries of a second, a second between


@pytest.mark.slow
def test_prepare_data_logs_a_line_per_file_read_and_none_per_request(hub, tmp_path):
    """The script as a user runs it, its output in files: what was read, not how."""
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts/prepare_data.py"), "data.train_size=1500",
         "tokenizer.vocab_size=500", f"data.cache_dir={tmp_path / 'data'}",
         f"hydra.run.dir={tmp_path / 'out'}"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    log = result.stdout + result.stderr  # the log's stream is Hydra's to choose
    read = [line for line in log.splitlines() if "rows drawn" in line]
    assert len(read) == 5 and all(PINNED in line for line in read)
    assert "HTTP Request" not in log and "httpx" not in log
    drawn = [
        int(re.search(r": ([\d,]+) of [\d,]+ rows drawn", line).group(1).replace(",", "")) for line in read
    ]
    assert sum(drawn[:3]) == 1500 and drawn[3:] == [VALID_ROWS, VALID_ROWS]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("data.hub_timeout_s=0", "data.hub_timeout_s=0.0: must be > 0"),
        ("data.hub_retries=-1", "data.hub_retries=-1"),
    ],
)
def test_hub_settings_that_cannot_work_are_refused_at_start(override, message, compose_train_cfg):
    with pytest.raises(NMTError, match=f"^{re.escape(message)}"):
        check_train_config(compose_train_cfg(override))
