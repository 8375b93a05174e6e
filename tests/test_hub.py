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
    train = [n for line, n in zip(read, drawn) if "/de-en/train-" in line]
    assert sum(train) == 1500 and sorted(drawn)[:2] == [VALID_ROWS, VALID_ROWS] and len(train) == 3


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


# ------------------------------------------------------------------ servers that misbehave, bad input


def test_a_server_sending_a_byte_at_a_time_fails_at_the_requests_deadline(hub, compose_train_cfg, tmp_path):
    hub.trickle_s = 0.05
    data = default_data(compose_train_cfg, tmp_path, "data.hub_deadline_s=1", "data.hub_retries=0")
    started = time.monotonic()
    with pytest.raises(NMTError) as e:
        load_source(data)
    assert time.monotonic() - started < 10
    message = str(e.value)
    assert "\n" not in message and "bytes in 1 s, and not finished (data.hub_deadline_s)" in message


def test_a_body_cut_off_halfway_is_asked_again(hub, compose_train_cfg, tmp_path):
    hub.cut = 2
    corpus = load_source(default_data(compose_train_cfg, tmp_path, "data.train_size=1500"))
    assert len(corpus["train"]["en"]) == 1500 and hub.cut == 0


def test_a_server_ignoring_ranges_is_read_once_per_small_file_and_said(
    hub, compose_train_cfg, tmp_path, caplog
):
    hub.ignore_range = True
    data = default_data(compose_train_cfg, tmp_path, "data.train_size=1500")
    corpus = load_source(data)
    assert len(corpus["train"]["en"]) == 1500
    for path in TRAIN_FILES:  # each file once, whole, however many row groups were drawn
        served = [r.body_bytes for r in hub.requests if r.path.endswith("/" + path)]
        assert served == [len(hub.files[path])], served
    assert "the server ignores byte ranges (it sent the whole file" in caplog.text


def test_a_server_ignoring_ranges_on_a_large_file_is_refused_before_its_body(
    hub, compose_train_cfg, tmp_path, monkeypatch
):
    from nmt.data import hub_api as hub_module

    monkeypatch.setattr(hub_module, "WHOLE_FILE_BYTES", 1000)
    hub.ignore_range = True
    with pytest.raises(NMTError) as e:
        load_source(default_data(compose_train_cfg, tmp_path, "data.train_size=1500"))
    message = str(e.value)
    assert "\n" not in message and "the server (or a proxy) ignores byte ranges" in message
    assert "refused" in message


@pytest.mark.parametrize("revision", [PINNED, "main"])
def test_a_captive_portal_page_is_said_as_what_came_back(hub, compose_train_cfg, tmp_path, revision):
    hub.portal = True
    with pytest.raises(NMTError) as e:
        load_source(default_data(compose_train_cfg, tmp_path, f"data.revision={revision}"))
    message = str(e.value)
    assert "\n" not in message and "got an HTML page titled 'Hotel WiFi - Sign in'" in message
    assert "captive portal" in message and "no config" not in message


def hf_data(compose_train_cfg, tmp_path, *overrides: str):
    return compose_train_cfg("data=hf", f"data.cache_dir={tmp_path / 'data'}", *overrides).data


def test_a_dataset_that_does_not_exist_says_so_and_how_to_log_in_if_private(hub, compose_train_cfg, tmp_path):
    with pytest.raises(NMTError) as e:
        prepare_text(hf_data(compose_train_cfg, tmp_path, "data.path=nobody/nothing"), progress=False)
    message = str(e.value)
    assert (
        "\n" not in message and "there is no dataset nobody/nothing on the hub, or it is private" in message
    )
    assert "`hf auth login`" in message


def test_a_config_that_does_not_exist_is_refused_naming_the_configs(hub, compose_train_cfg, tmp_path):
    from hub_datasets import wmt

    hub.add_repo("wmt/wmt16", wmt("16", ["de-en", "ro-en"]))
    with pytest.raises(NMTError) as e:
        prepare_text(compose_train_cfg("data=wmt16", "data.tgt_lang=ja").data, progress=False)
    assert "no config 'ja-en'; it has de-en, ro-en; check data.config_name" in str(e.value)


def test_a_loading_script_without_a_parquet_conversion_is_refused(hub, compose_train_cfg, tmp_path):
    hub.add_repo("someone/scripted", {"README.md": b"# no card header\n", "scripted.py": b"# script\n"})
    data = hf_data(compose_train_cfg, tmp_path, "data.path=someone/scripted")
    with pytest.raises(NMTError) as e:
        prepare_text(data, progress=False)
    message = str(e.value)
    assert (
        "\n" not in message
        and "has no parquet files at data.revision=main and no parquet conversion" in message
    )
    assert not list((tmp_path / "data").rglob("meta.json"))  # nothing that looks prepared


def test_a_split_smaller_than_the_drawn_valid_and_test_is_refused(hub, compose_train_cfg, tmp_path):
    from hub_datasets import opus_books

    hub.add_repo("Helsinki-NLP/opus_books", opus_books(["de-en"]))
    data = hf_data(
        compose_train_cfg, tmp_path, "data.path=Helsinki-NLP/opus_books", "data.config_name=de-en",
        "data.valid_split=null", "data.test_split=null", "data.valid_size=150", "data.test_size=100",
    )  # fmt: skip
    with pytest.raises(NMTError) as e:
        prepare_text(data, progress=False)
    message = str(e.value)
    assert "has 200 pairs, too few to draw data.valid_size=150 and data.test_size=100 from it" in message
    assert not list((tmp_path / "data").rglob("meta.json"))


def test_the_cache_keys_of_the_existing_presets_gain_only_the_held_out_rule(compose_train_cfg):
    """Settings added to the hub source are left out of the key at their no-effect defaults: the WMT14
    preset's key holds what it held, plus the rule that drops valid/test pairs from training (which
    changes the text); the toy task's is unchanged (its splits keep their pairs)."""
    from nmt.cache import hash_key
    from nmt.data.corpus import _text_settings

    before = {"source", "path", "config_name", "revision", "data_files", "train_size", "seed", "train_split",
              "valid_split", "test_split", "clean", "langs", "text_version"}  # fmt: skip
    assert set(_text_settings(compose_train_cfg().data)) == before | {"held_out_removed"}
    assert hash_key(_text_settings(compose_train_cfg("data=toy").data)) == "c358908aaec6"
