"""Multi30k found in data.dir, in the download cache, or fetched from a real HTTP server on 127.0.0.1 and
checked against pinned digests; a corrupt, cut or unreachable download leaves nothing cached."""

import gzip
import hashlib
import http.server
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import pytest

import nmt.data.download as download
from nmt.config import LocalDataConfig, Multi30kDataConfig, TokenizerConfig
from nmt.data import prepare_corpus, prepare_text, read_text
from nmt.data.download import MULTI30K_FILES, download_cache, multi30k_dir
from nmt.data.sources import load_source, resolve_source
from nmt.errors import NMTError

REPO = Path(__file__).resolve().parents[1]
SHARED_MULTI30K = REPO / "../shared/data/multi30k-de-en"
needs_shared = pytest.mark.skipif(
    not (SHARED_MULTI30K / "train.en").is_file(), reason="../shared/data not available"
)


@dataclass
class Misbehaviour:
    """What the test server does instead of serving a file, by the file's name."""

    cut: set[str] = field(default_factory=set)  # declares the whole length, sends half of it
    trickle: set[str] = field(default_factory=set)  # declares 30 bytes, sends one every 0.2 s
    endless: set[str] = field(default_factory=set)  # sends zeros (no length) until 64 MB or a hang-up
    redirect: dict[str, str] = field(default_factory=dict)  # answers 302 to this URL
    sent: dict[str, int] = field(default_factory=dict)  # bytes of the endless bodies sent, when done
    requests: list[str] = field(default_factory=list)  # the paths asked for


class Handler(http.server.SimpleHTTPRequestHandler):
    """Serves a folder, misbehaving as ``odd`` says."""

    odd: Misbehaviour

    def do_GET(self) -> None:
        name = self.path.rsplit("/", 1)[-1]
        self.odd.requests.append(self.path)
        try:
            if name in self.odd.redirect:
                self.send_response(302)
                self.send_header("Location", self.odd.redirect[name])
                self.end_headers()
            elif name in self.odd.cut:
                body = Path(self.translate_path(self.path)).read_bytes()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
            elif name in self.odd.trickle:
                self.send_response(200)
                self.send_header("Content-Length", "30")
                self.end_headers()
                for _ in range(30):
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    time.sleep(0.2)
            elif name in self.odd.endless:
                self.send_response(200)
                self.end_headers()
                sent = 0
                try:
                    while sent < 64 << 20:
                        self.wfile.write(bytes(1 << 16))
                        sent += 1 << 16
                finally:
                    self.odd.sent[name] = sent
            else:
                return super().do_GET()
        except OSError:  # the client hung up
            pass
        self.close_connection = True

    def log_message(self, *args) -> None:
        pass


@dataclass
class Server:
    url: str  # of the folder of the .gz files
    root: Path  # the folder it serves them from
    odd: Misbehaviour


@pytest.fixture
def server(tmp_path) -> Iterator[Server]:
    root = tmp_path / "served" / "task1" / "raw"
    root.mkdir(parents=True)
    odd = Misbehaviour()
    handler = type("OddHandler", (Handler,), {"odd": odd})
    httpd = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), partial(handler, directory=str(tmp_path / "served"))
    )
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield Server(f"http://127.0.0.1:{httpd.server_address[1]}/task1/raw", root, odd)
    httpd.shutdown()
    httpd.server_close()


def serve_gzipped(texts: dict[str, bytes], root: Path) -> None:
    """Our file names' texts as the repository's ``{name}.gz`` files."""
    for name, text in texts.items():
        remote = f"{download.SPLIT_FILES[name.split('.')[0]]}.{name.split('.')[1]}"
        (root / f"{remote}.gz").write_bytes(gzip.compress(text))


@pytest.fixture
def synthetic(monkeypatch) -> dict[str, bytes]:
    """Six small English-German texts whose digests stand in for the pinned ones (no shared data
    needed), as are those of French and Czech (:func:`all_synthetic`): our file name -> text."""
    texts = all_synthetic()
    pinned = {f"{download.SPLIT_FILES[n.split('.')[0]]}.{n.split('.')[1]}": t for n, t in texts.items()}
    digests = {name: hashlib.sha256(text).hexdigest() for name, text in pinned.items()}
    monkeypatch.setattr(download, "DIGESTS", digests)
    return {name: text for name, text in texts.items() if name.endswith((".en", ".de"))}


def all_synthetic() -> dict[str, bytes]:
    return {
        f"{ours}.{lang}": f"{ours}.{lang} line one\n{ours}.{lang} line two\n".encode()
        for ours in download.SPLIT_FILES
        for lang in ("en", *download.TRANSLATIONS)
    }


def config(tmp_path: Path, url: str, **kwargs) -> Multi30kDataConfig:
    return Multi30kDataConfig(
        dir=str(tmp_path / "no-copy"), cache_dir=str(tmp_path / "data"), url=url, **kwargs
    )


def nothing_cached(cfg: Multi30kDataConfig) -> bool:
    downloads = download_cache(cfg).parent
    return not downloads.exists() or not any(downloads.iterdir())


def test_the_download_is_checked_cached_and_reused_offline(tmp_path, server, synthetic):
    serve_gzipped(synthetic, server.root)
    cfg = config(tmp_path, server.url)
    folder = multi30k_dir(cfg)
    assert folder == download_cache(cfg)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == synthetic
    for gz in server.root.iterdir():  # the server no longer has them: the cache answers
        gz.unlink()
    assert multi30k_dir(cfg) == folder


def test_a_copy_in_data_dir_comes_first_and_is_checked(tmp_path, synthetic):
    copy = tmp_path / "copy"
    copy.mkdir()
    for name, text in synthetic.items():
        (copy / name).write_bytes(text)
    cfg = Multi30kDataConfig(dir=str(copy), cache_dir=str(tmp_path / "data"), url="http://127.0.0.1:9/none")
    assert multi30k_dir(cfg) == copy
    (copy / "valid.de").write_bytes(b"edited\n")
    with pytest.raises(
        NMTError, match=r"valid.de: SHA-256 \w+ does not match Multi30k's valid.de, \w+; .*data=local"
    ):
        multi30k_dir(cfg)


def test_a_corrupt_file_is_refused_naming_it_and_both_digests(tmp_path, server, synthetic):
    url, root = server.url, server.root
    serve_gzipped({**synthetic, "test.de": b"tampered\n"}, root)
    cfg = config(tmp_path, url)
    got, want = hashlib.sha256(b"tampered\n").hexdigest(), hashlib.sha256(synthetic["test.de"]).hexdigest()
    with pytest.raises(NMTError) as e:
        multi30k_dir(cfg)
    assert str(e.value) == (
        f"{url}/test_2016_flickr.de.gz: SHA-256 {got} does not match Multi30k's test.de, {want}; "
        "nothing was cached"
    )
    assert nothing_cached(cfg)


def test_an_interrupted_transfer_is_refused_and_nothing_is_cached(tmp_path, server, synthetic):
    serve_gzipped(synthetic, server.root)
    server.odd.cut.add("val.en.gz")
    cfg = config(tmp_path, server.url)
    with pytest.raises(
        NMTError, match=r"val.en.gz: the transfer stopped after \d+ of \d+ bytes; nothing was cached"
    ):
        multi30k_dir(cfg)
    assert nothing_cached(cfg)
    server.odd.cut.clear()  # the retry completes
    assert multi30k_dir(cfg) == download_cache(cfg)


def test_a_truncated_gzip_is_refused(tmp_path, server, synthetic):
    url, root = server.url, server.root
    serve_gzipped(synthetic, root)
    gz = root / "train.de.gz"
    gz.write_bytes(gz.read_bytes()[:-12])
    cfg = config(tmp_path, url)
    with pytest.raises(NMTError, match=r"train.de.gz: not a complete gzip file"):
        multi30k_dir(cfg)
    assert nothing_cached(cfg)


def test_a_gzip_bomb_stops_at_the_size_of_a_multi30k_file(tmp_path, server, synthetic):
    url, root = server.url, server.root
    serve_gzipped(synthetic, root)
    (root / "train.en.gz").write_bytes(
        gzip.compress(bytes(download.MAX_BYTES + 1))
    )  # 16 kB unzipping to 16 MB
    cfg = config(tmp_path, url)
    with pytest.raises(
        NMTError, match=r"train.en.gz: unzips to more than 16 MB, far more than any Multi30k file"
    ):
        multi30k_dir(cfg)
    assert nothing_cached(cfg)


def test_offline_with_nothing_to_read_says_what_to_fetch_and_where(tmp_path, server):
    url = server.url  # serves nothing: every file is a 404
    cfg = config(tmp_path, url)
    with pytest.raises(NMTError) as e:
        multi30k_dir(cfg)
    message = str(e.value)
    assert "\n" not in message
    assert (
        f"could not be fetched (HTTPError: File not found): download {url}/{{train,val,test_2016_flickr}}"
        in message
    )
    assert f"gunzip them into {download_cache(cfg)}/ as {{train,valid,test}}.{{en,de}}" in message
    assert "or point data.dir=... at a folder holding those six files" in message
    unreachable = config(tmp_path, "http://127.0.0.1:9/raw")  # the discard port: nothing listens
    with pytest.raises(
        NMTError, match=r"could not be fetched \(URLError: .*\): download http://127.0.0.1:9/raw/"
    ):
        multi30k_dir(unreachable)
    assert nothing_cached(cfg)


def test_the_size_cap_is_counted_without_a_progress_bar(tmp_path, server, synthetic, monkeypatch):
    serve_gzipped(synthetic, server.root)
    server.odd.endless.add("train.en.gz")
    cfg = config(tmp_path, server.url)
    with pytest.raises(NMTError, match=r"train.en.gz: more than 16 MB, far more than any Multi30k file"):
        multi30k_dir(cfg, progress=False)
    for _ in range(100):  # the server stops writing once the client has hung up
        if "train.en.gz" in server.odd.sent:
            break
        time.sleep(0.1)
    assert server.odd.sent["train.en.gz"] < 40 << 20  # stopped near 16 MB, not at the end of 64 MB
    assert nothing_cached(cfg)


def test_a_trickling_server_fails_at_the_files_deadline(tmp_path, server, synthetic, monkeypatch):
    """A byte every 0.2 s keeps every read within its timeout: the deadline of the whole file ends it."""
    serve_gzipped(synthetic, server.root)
    server.odd.trickle.add("train.en.gz")
    monkeypatch.setattr(download, "DEADLINE_S", 1)
    cfg = config(tmp_path, server.url)
    started = time.monotonic()
    with pytest.raises(
        NMTError, match=r"train.en.gz: \d+ bytes in 1 s, and not finished; nothing was cached: run again"
    ):
        multi30k_dir(cfg)
    assert time.monotonic() - started < 4  # the whole body would take 6 s
    assert nothing_cached(cfg)


def test_the_download_cache_is_checked_naming_the_file_and_how_to_download_again(tmp_path, server, synthetic):
    serve_gzipped(synthetic, server.root)
    cfg = config(tmp_path, server.url)
    cache = download_cache(cfg)
    cache.mkdir(parents=True)  # filled by hand, as the offline message says: one file of another version
    for name, text in synthetic.items():
        (cache / name).write_bytes(text if name != "train.de" else b"another version\n")
    with pytest.raises(
        NMTError,
        match=rf"{cache}/train.de: SHA-256 \w+ does not match Multi30k's train.de, \w+; delete {cache} "
        "to download Multi30k again",
    ):
        multi30k_dir(cfg)
    (cache / "train.de").unlink()  # a copy cut short
    with pytest.raises(NMTError, match=rf"{cache}/train.de: missing from the download cache; delete {cache}"):
        multi30k_dir(cfg)
    assert not server.odd.requests
    shutil.rmtree(cache)
    assert multi30k_dir(cfg) == cache and (cache / "train.de").read_bytes() == synthetic["train.de"]


@pytest.mark.parametrize("form", ["path", "relative path", "file URL"])
def test_a_local_folder_is_a_mirror(tmp_path, server, synthetic, form, monkeypatch):
    serve_gzipped(synthetic, server.root)
    monkeypatch.chdir(server.root.parent)
    url = {"path": str(server.root), "relative path": "raw", "file URL": server.root.as_uri()}[form]
    cfg = config(tmp_path, url)
    folder = multi30k_dir(cfg)
    assert folder == download_cache(cfg) and {p.name: p.read_bytes() for p in folder.iterdir()} == synthetic
    (server.root / "val.de.gz").unlink()
    with pytest.raises(NMTError, match=r"val.de.gz: cannot read it \(No such file or directory\); data.url="):
        multi30k_dir(config(tmp_path / "other", url))


def test_other_schemes_are_refused_in_one_line_and_so_are_redirects_to_them(tmp_path, server, synthetic):
    with pytest.raises(NMTError) as e:
        multi30k_dir(config(tmp_path, "ftp://127.0.0.1:9/raw"))
    assert str(e.value) == (
        "data.url=ftp://127.0.0.1:9/raw: expected an http:// or https:// URL, or a local folder (a path or "
        "file:///path) holding {train,val,test_2016_flickr}.{en,de,fr,cs}.gz"
    )
    serve_gzipped(synthetic, server.root)
    server.odd.redirect["train.en.gz"] = "ftp://127.0.0.1:9/raw/train.en.gz"
    cfg = config(tmp_path, server.url)
    with pytest.raises(NMTError) as e:
        multi30k_dir(cfg)
    assert "\n" not in str(e.value)
    assert (
        "train.en.gz could not be fetched (HTTPError: redirected to a ftp: URL, only http(s) is followed)"
        in (str(e.value))
    )
    assert nothing_cached(cfg)


def test_a_url_with_credentials_is_refused_without_showing_them(tmp_path, server, synthetic):
    serve_gzipped(synthetic, server.root)
    secret = server.url.replace("http://", "http://user:TOKEN@")
    cfg = config(tmp_path, secret)
    with pytest.raises(NMTError) as e:
        multi30k_dir(cfg)
    assert str(e.value).startswith(
        f"data.url={server.url.replace('http://', 'http://***@')} holds credentials"
    )
    assert "TOKEN" not in str(e.value) and not server.odd.requests and nothing_cached(cfg)


def test_the_scripts_refuse_credentials_before_anything_is_written(tmp_path):
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts/prepare_data.py"), "data=multi30k", "data.dir=absent",
         "data.url=https://user:TOKEN@127.0.0.1:9/raw", "data.cache_dir=data"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 1 and "TOKEN" not in result.stdout + result.stderr
    assert result.stderr.splitlines() == [
        "error: data.url=https://***@127.0.0.1:9/raw: a URL with credentials, refused before anything is "
        "written (they would be kept in the run's log, .hydra/ and checkpoints); use a mirror that needs "
        "none, or fetch the files yourself into a folder and give its path (data.url=/that/folder)"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no outputs/ (.hydra/, log), no data/


@pytest.mark.parametrize(("src", "tgt"), [("en", "ja"), ("de", "fr"), ("en", "en")])
def test_multi30k_pairs_english_with_german_french_or_czech(src, tgt):
    with pytest.raises(
        NMTError,
        match=f"^data=multi30k pairs English with one of de, fr, cs, got data.src_lang='{src}', "
        f"data.tgt_lang='{tgt}'$",
    ):
        multi30k_dir(Multi30kDataConfig(src_lang=src, tgt_lang=tgt))


@pytest.mark.parametrize(("src", "tgt"), [("en", "fr"), ("cs", "en")])
def test_french_and_czech_come_from_their_pinned_files_in_either_direction(tmp_path, synthetic, src, tgt):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    serve_gzipped(all_synthetic(), mirror)
    cfg = config(tmp_path, str(mirror), src_lang=src, tgt_lang=tgt)
    corpus = load_source(cfg)
    other = tgt if src == "en" else src
    assert corpus["test"][other] == [f"test.{other} line one", f"test.{other} line two"]
    assert corpus["train"]["en"] == ["train.en line one", "train.en line two"]
    assert sorted(p.name for p in multi30k_dir(cfg).iterdir()) == sorted(
        f"{s}.{lang}" for s in ("train", "valid", "test") for lang in ("en", other)
    )
    assert multi30k_dir(cfg) != multi30k_dir(config(tmp_path, str(mirror)))  # one cache per pair


def test_the_french_and_czech_digests_are_the_shared_upstream_files():
    raw = REPO / "../shared/data/multi30k-raw"
    if not raw.is_dir():
        pytest.skip("../shared/data not available")
    for name, digest in download.DIGESTS.items():
        assert hashlib.sha256(gzip.decompress((raw / f"{name}.gz").read_bytes())).hexdigest() == digest


def test_a_preset_without_its_local_files_falls_back_to_the_hub(compose_train_cfg, tmp_path, caplog):
    cfg = compose_train_cfg("experiment=wmt14_subset_cpu", f"data.dir={tmp_path / 'absent'}").data
    hub = resolve_source(cfg)
    assert (hub.source, hub.path, hub.train_size, hub.clean.max_words) == ("hf", "wmt/wmt14", 33071, 100)
    assert "drawing 33071 training pairs from WMT14 on the Hugging Face hub instead" in caplog.text
    local = LocalDataConfig(dir=str(tmp_path / "absent"), name="x")
    assert resolve_source(local) is local  # no fallback: reading it says what is missing


def test_the_presets_read_multi30k_through_its_source(compose_train_cfg):
    for preset in ("multi30k_cpu", "multi30k_small_cpu", "multi30k_rnnsearch_cpu", "multi30k_gqa_cpu"):
        data = compose_train_cfg(f"experiment={preset}").data
        assert (data.source, data.dir, data.name) == (
            "multi30k",
            "../shared/data/multi30k-de-en",
            "multi30k-de-en",
        )
    student = compose_train_cfg("experiment=multi30k_distill_cpu").data
    assert (student.source, student.dir) == ("local", "DISTILLED_CORPUS")


@needs_shared
def test_a_fresh_clone_downloads_the_same_corpus_as_the_shared_copy(tmp_path, server):
    """The README's main job in a folder with no ../shared: prepare_data.py fetches Multi30k from the
    server and prepares the same ids as from data.dir."""
    url, root = server.url, server.root
    serve_gzipped({name: (SHARED_MULTI30K / name).read_bytes() for name in MULTI30K_FILES}, root)
    clone = tmp_path / "clone" / "nmt"
    clone.mkdir(parents=True)
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts/prepare_data.py"), "data=multi30k", f"data.url={url}",
         "tokenizer.vocab_size=1000", "hydra.run.dir=outputs/prepare"],
        cwd=clone, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "downloading it from" in result.stdout + result.stderr and "28,998" in result.stdout
    downloaded = prepare_corpus(
        Multi30kDataConfig(dir="absent", cache_dir=str(clone / "data"), url="http://127.0.0.1:9/unused"),
        TokenizerConfig(vocab_size=1000),
        progress=False,
    )
    assert downloaded.root.is_relative_to(clone / "data")
    local = prepare_corpus(
        Multi30kDataConfig(dir=str(SHARED_MULTI30K), cache_dir=str(tmp_path / "local")),
        TokenizerConfig(vocab_size=1000),
        progress=False,
    )
    assert downloaded.root.name == local.root.name  # one cache key, wherever the files were found
    for split in ("train", "valid", "test"):
        a, b = downloaded.splits[split], local.splits[split]
        assert np.array_equal(a.src_lengths, b.src_lengths) and np.array_equal(a.tgt_lengths, b.tgt_lengths)
        assert all(
            np.array_equal(a.src(i), b.src(i)) and np.array_equal(a.tgt(i), b.tgt(i)) for i in range(len(a))
        )


@pytest.mark.parametrize(("src", "tgt"), [("en", "fr"), ("en", "cs"), ("fr", "en")])
def test_french_and_czech_prepare_from_the_pinned_upstream_files(tmp_path, src, tgt):
    """The upstream gzip files, served from a local folder as data.url, pass their pinned digests; the
    reversed pair shares the prepared text."""
    raw = REPO / "../shared/data/multi30k-raw"
    if not raw.is_dir():
        pytest.skip("../shared/data not available")
    cfg = Multi30kDataConfig(dir=str(tmp_path / "none"), cache_dir=str(tmp_path / "data"), url=str(raw),
                             src_lang=src, tgt_lang=tgt, name="m")  # fmt: skip
    root = prepare_text(cfg, progress=False)
    other = tgt if src == "en" else src
    assert len(read_text(root, "test", other)) == 1000 and len(read_text(root, "valid", "en")) == 1014
    reverse = Multi30kDataConfig(dir=str(tmp_path / "none"), cache_dir=str(tmp_path / "data"), url=str(raw),
                                 src_lang=tgt, tgt_lang=src, name="m")  # fmt: skip
    assert prepare_text(reverse, progress=False) == root
