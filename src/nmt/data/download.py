"""Multi30k's official files: found in a local copy, in the download cache, or fetched once.

The files are the multi30k/dataset repository's raw task-1 text at one commit, gzip'd: English and its
German, French and Czech translations. Each is checked against the SHA-256 of its gunzipped text,
pinned below, wherever it comes from, so a local copy, the cache and a fresh download are the same
corpus (and share one prepared cache). The download is written to a temporary folder and renamed when
all six files of the pair have passed: an interrupted or corrupt download leaves nothing that looks
complete.

``data.url`` is an http(s) URL or a local folder (a path, or ``file:///path``) holding the gzip'd
files. A URL with credentials (``https://user:token@host/``) is refused before anything is fetched:
they would be shown in the log and kept in the run's config and every checkpoint.
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import io
import logging
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib
from pathlib import Path

from tqdm import tqdm

from nmt.cache import atomic_dir
from nmt.config import Multi30kDataConfig
from nmt.errors import NMTError, hide_credentials

log = logging.getLogger(__name__)

MULTI30K_COMMIT = "a3d2e0d26b56"
# The repository's file (without .gz) -> SHA-256 of its text.
DIGESTS = {
    "train.en": "460a15fbd157e34a7a9957ee388c1ca247fe47af3ef25fb50442af6c274e0fc6",
    "train.de": "2c2b73fd2b548fbcde3a875e0a78d6ee94d498bfdee6bd3eae3945779e9ddf72",
    "train.fr": "5925a3c18f1587b6b54b87743106e6e8ab93618edb6f65d19eac0621f853a10d",
    "train.cs": "2be68b38c8d586ff4f54eb13cc6e1baaaa053695b3f070d3038303a47f2268da",
    "val.en": "1f2a23d992769b5b3d209b0a10dd0b77c08cceb1f20dfb97ed0aafa49d107227",
    "val.de": "660e09eb7e1da2f856ea13ee5ad3cf6d36b3d5b0b733c857e94c5747a3dfc660",
    "val.fr": "5304e444d842e962b2dda4d816b70b22a1765b15401642b7ca37a67477e708dc",
    "val.cs": "d53827e469b0a1ca8d57e9e26b2b64c4bc4b33f5479c7b03ae87ae5c882c3e33",
    "test_2016_flickr.en": "399a4382932c1aadd3ceb9bef1008d388a64c76d4ae4e9d4728c6f4301cac182",
    "test_2016_flickr.de": "4be6b5b3236b79c25475c6bb829800a7ce559e9ba7a1f6c2394fe4d40be46d16",
    "test_2016_flickr.fr": "cb3160d69b002bb638e66cc7612fcd56cb0af82eadc9c142dedc438afb885ef6",
    "test_2016_flickr.cs": "45adb85f688de8407fddcbe1b36dca15d12aab868149b337e2576f2d6d2ff8d8",
}
SPLIT_FILES = {"train": "train", "valid": "val", "test": "test_2016_flickr"}  # ours -> the repository's
TRANSLATIONS = ("de", "fr", "cs")  # of the English captions


def multi30k_files(langs: tuple[str, str] | list[str] = ("en", "de")) -> dict[str, tuple[str, str]]:
    """Our file name -> (the repository's file without .gz, SHA-256 of its text), for a pair."""
    return {
        f"{ours}.{lang}": (f"{theirs}.{lang}", DIGESTS[f"{theirs}.{lang}"])
        for ours, theirs in SPLIT_FILES.items()
        for lang in sorted(langs, key=lambda code: code != "en")
    }


MULTI30K_FILES = multi30k_files()  # English-German, the default pair
TIMEOUT_S = 60  # per connection attempt and read: a stalled server fails instead of hanging
DEADLINE_S = 600  # per file, checked at every read: a server that trickles bytes fails too
MAX_BYTES = 16 << 20  # of a file, gzip'd or not: the largest Multi30k text is 2.1 MB (a bomb stops here)
READ_BYTES = 1 << 16  # at most, per read; a read returns what has arrived (read1), so deadlines are kept
OTHER_TEXT_HINT = (
    "; data=multi30k reads Multi30k's official text only: use data=local data.dir=... for other text"
)


def multi30k_dir(cfg: Multi30kDataConfig, progress: bool = False) -> Path:
    """The folder holding the pair's six checked files: ``data.dir``, else the download cache, else a
    new download into the cache (needs the internet once, unless ``data.url`` is a local folder)."""
    files = multi30k_files(check_pair(cfg))
    mirror = _mirror(cfg.url)
    local = Path(cfg.dir)
    if all((local / name).is_file() for name in files):
        for name in files:
            _check(local / name, (local / name).read_bytes(), name, OTHER_TEXT_HINT)
        return local
    cache = download_cache(cfg)
    if cache.is_dir():
        _check_cache(cache, files)
        return cache
    log.info("Multi30k is not in data.dir=%s: downloading it from %s into %s", cfg.dir, cfg.url, cache)
    with atomic_dir(cache) as tmp:
        for name, (remote, _) in files.items():
            if isinstance(mirror, Path):
                where: Path | str = mirror / f"{remote}.gz"
                body = _read_local(where)
            else:
                where = f"{mirror.rstrip('/')}/{remote}.gz"
                body = _fetch(where, cfg, cache, progress)
            (tmp / name).write_bytes(_check(where, _gunzip(where, body), name, "; nothing was cached"))
    return cache


def check_pair(cfg: Multi30kDataConfig) -> tuple[str, str]:
    """English and one of its translations, either way round."""
    pair = (cfg.src_lang, cfg.tgt_lang)
    if "en" not in pair or not set(pair) - {"en"} <= set(TRANSLATIONS) or len(set(pair)) != 2:
        raise NMTError(
            f"data=multi30k pairs English with one of {', '.join(TRANSLATIONS)}, got "
            f"data.src_lang={cfg.src_lang!r}, data.tgt_lang={cfg.tgt_lang!r}"
        )
    return pair


def download_cache(cfg: Multi30kDataConfig) -> Path:
    """One folder per pair (English-German's, the first, is named without its pair)."""
    other = next(lang for lang in check_pair(cfg) if lang != "en")
    pair = "" if other == "de" else f"-en-{other}"
    return Path(cfg.cache_dir) / "downloads" / f"multi30k-{MULTI30K_COMMIT}{pair}"


def _mirror(url: str) -> str | Path:
    """``data.url`` as what to read from: an http(s) URL, or a local folder (a path or ``file:///``)."""
    parts = urllib.parse.urlsplit(url)
    if "@" in parts.netloc:
        raise NMTError(
            f"data.url={hide_credentials(url)} holds credentials: refused, so that they are shown in no "
            "log and kept in no config or checkpoint; use a mirror that needs none, or fetch the files "
            "yourself into a folder and set data.url=/that/folder"
        )
    scheme = parts.scheme.lower()
    if scheme in ("http", "https"):
        return url
    if scheme == "file" and parts.netloc in ("", "localhost"):
        return Path(urllib.request.url2pathname(parts.path))
    if scheme == "":
        return Path(url)
    raise NMTError(
        f"data.url={url}: expected an http:// or https:// URL, or a local folder (a path or file:///path) "
        "holding {train,val,test_2016_flickr}.{en,de,fr,cs}.gz"
    )


def _check_cache(cache: Path, files: dict[str, tuple[str, str]]) -> None:
    """The six files of the download cache, checked as data.dir's are: a folder filled by hand, cut
    short or holding another version is refused, naming the file."""
    again = f"; delete {cache} to download Multi30k again"
    for name in files:
        path = cache / name
        if not path.is_file():
            raise NMTError(f"{path}: missing from the download cache{again}")
        _check(path, path.read_bytes(), name, again)


class _HTTPRedirects(urllib.request.HTTPRedirectHandler):
    """Follows redirects to http(s) URLs only: another scheme (ftp:, file:) is an error, not a read."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        scheme = urllib.parse.urlsplit(newurl).scheme.lower()
        if scheme not in ("http", "https"):
            raise urllib.error.HTTPError(
                req.full_url, code, f"redirected to a {scheme}: URL, only http(s) is followed", headers, fp
            )
        return super().redirect_request(req, fp, code, msg, headers, newurl)


_OPENER = urllib.request.build_opener(_HTTPRedirects)


def _fetch(url: str, cfg: Multi30kDataConfig, cache: Path, progress: bool) -> bytes:
    """The body at ``url``, all of it: a transfer cut short is an error, not a shorter file; so is one
    over ``MAX_BYTES`` (counted here, whether a progress bar is shown or not) or one still going after
    ``DEADLINE_S`` (checked at every read, each of which waits ``TIMEOUT_S`` at most)."""
    started = time.monotonic()
    chunks, received = [], 0
    try:
        with _OPENER.open(url, timeout=TIMEOUT_S) as response:
            expected = response.length
            with tqdm(
                total=expected, unit="B", unit_scale=True, desc=url.rsplit("/", 1)[-1], disable=not progress
            ) as bar:
                while chunk := response.read1(READ_BYTES):
                    received += len(chunk)
                    if received > MAX_BYTES:
                        raise NMTError(
                            f"{url}: more than {MAX_BYTES >> 20} MB, far more than any Multi30k file; "
                            "nothing was cached"
                        )
                    if time.monotonic() - started > DEADLINE_S:
                        raise NMTError(
                            f"{url}: {received:,} bytes in {DEADLINE_S} s, and not finished; nothing was "
                            "cached: run again to retry, or use a faster mirror (data.url=...)"
                        )
                    chunks.append(chunk)
                    bar.update(len(chunk))
    except (urllib.error.URLError, http.client.HTTPException, OSError) as e:
        raise NMTError(_offline_message(cfg, cache, url, e)) from None
    if expected is not None and received < expected:
        raise NMTError(
            f"{url}: the transfer stopped after {received:,} of {expected:,} bytes; nothing was cached, "
            "run again to retry"
        )
    return b"".join(chunks)


def _read_local(path: Path) -> bytes:
    """A file of a local mirror (``data.url`` a folder), read up to ``MAX_BYTES``."""
    try:
        with open(path, "rb") as f:
            body = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise NMTError(
            f"{path}: cannot read it ({e.strerror or e}); data.url={path.parent} must hold "
            "{train,val,test_2016_flickr}.{en,de,fr,cs}.gz"
        ) from None
    if len(body) > MAX_BYTES:
        raise NMTError(f"{path}: more than {MAX_BYTES >> 20} MB, far more than any Multi30k file")
    return body


def _offline_message(cfg: Multi30kDataConfig, cache: Path, url: str, error: Exception) -> str:
    reason = getattr(error, "reason", None) or error
    langs = ",".join(sorted(check_pair(cfg), key=lambda code: code != "en"))
    return hide_credentials(
        f"Multi30k is in neither data.dir={cfg.dir} nor {cache}, and {url} could not be fetched "
        f"({type(error).__name__}: {reason}): download "
        f"{cfg.url}/{{train,val,test_2016_flickr}}.{{{langs}}}.gz, gunzip them into {cache}/ "
        f"as {{train,valid,test}}.{{{langs}}}, or point data.dir=... at a folder "
        "holding those six files"
    )


def _gunzip(url: str, data: bytes) -> bytes:
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as f:
            text = f.read(MAX_BYTES + 1)
    except (OSError, EOFError, zlib.error) as e:  # BadGzipFile is an OSError; a cut stream an EOFError
        raise NMTError(
            f"{url}: not a complete gzip file ({e}); nothing was cached, run again to retry"
        ) from None
    if len(text) > MAX_BYTES:
        raise NMTError(
            f"{url}: unzips to more than {MAX_BYTES >> 20} MB, far more than any Multi30k file; "
            "nothing was cached"
        )
    return text


def _check(where: Path | str, text: bytes, name: str, hint: str) -> bytes:
    """``text`` when its SHA-256 is the one pinned for ``name``; else one line naming both digests, then
    ``hint`` (what to do)."""
    split, lang = name.split(".")
    got, want = hashlib.sha256(text).hexdigest(), DIGESTS[f"{SPLIT_FILES[split]}.{lang}"]
    if got != want:
        raise NMTError(f"{where}: SHA-256 {got} does not match Multi30k's {name}, {want}{hint}")
    return text
