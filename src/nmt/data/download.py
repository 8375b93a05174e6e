"""Multi30k's official files: found in a local copy, in the download cache, or fetched once.

The files are the multi30k/dataset repository's raw task-1 text at one commit, gzip'd. Each is checked
against the SHA-256 of its gunzipped text, pinned below, wherever it comes from, so a local copy, the
cache and a fresh download are the same corpus (and share one prepared cache). The download is
written to a temporary folder and renamed when all six files have passed: an interrupted or corrupt
download leaves nothing that looks complete.
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import io
import logging
import urllib.error
import urllib.request
import zlib
from pathlib import Path

from tqdm import tqdm

from nmt.cache import atomic_dir
from nmt.config import Multi30kDataConfig
from nmt.errors import NMTError

log = logging.getLogger(__name__)

MULTI30K_COMMIT = "a3d2e0d26b56"
# Our file name -> (the file's name in the repository, without .gz; SHA-256 of its text).
MULTI30K_FILES = {
    "train.en": ("train.en", "460a15fbd157e34a7a9957ee388c1ca247fe47af3ef25fb50442af6c274e0fc6"),
    "train.de": ("train.de", "2c2b73fd2b548fbcde3a875e0a78d6ee94d498bfdee6bd3eae3945779e9ddf72"),
    "valid.en": ("val.en", "1f2a23d992769b5b3d209b0a10dd0b77c08cceb1f20dfb97ed0aafa49d107227"),
    "valid.de": ("val.de", "660e09eb7e1da2f856ea13ee5ad3cf6d36b3d5b0b733c857e94c5747a3dfc660"),
    "test.en": ("test_2016_flickr.en", "399a4382932c1aadd3ceb9bef1008d388a64c76d4ae4e9d4728c6f4301cac182"),
    "test.de": ("test_2016_flickr.de", "4be6b5b3236b79c25475c6bb829800a7ce559e9ba7a1f6c2394fe4d40be46d16"),
}
LANGS = ("en", "de")
TIMEOUT_S = 60  # per connection attempt and read: a stalled server fails instead of hanging
MAX_BYTES = 16 << 20  # of a file, gzip'd or not: the largest Multi30k text is 2.1 MB (a bomb stops here)


def multi30k_dir(cfg: Multi30kDataConfig, progress: bool = False) -> Path:
    """The folder holding the six checked files: ``data.dir``, else the download cache, else a new
    download into the cache (needs the internet once)."""
    if {cfg.src_lang, cfg.tgt_lang} != set(LANGS):
        raise NMTError(
            f"data=multi30k has languages en and de, got data.src_lang={cfg.src_lang!r}, "
            f"data.tgt_lang={cfg.tgt_lang!r}"
        )
    local = Path(cfg.dir)
    if all((local / name).is_file() for name in MULTI30K_FILES):
        for name in MULTI30K_FILES:
            _check(local / name, (local / name).read_bytes(), name, where_kind="data.dir")
        return local
    cache = download_cache(cfg)
    if cache.is_dir():
        return cache
    log.info("Multi30k is not in data.dir=%s: downloading it from %s into %s", cfg.dir, cfg.url, cache)
    with atomic_dir(cache) as tmp:
        for name, (remote, _) in MULTI30K_FILES.items():
            url = f"{cfg.url.rstrip('/')}/{remote}.gz"
            (tmp / name).write_bytes(_check(url, _gunzip(url, _fetch(url, cfg, cache, progress)), name))
    return cache


def download_cache(cfg: Multi30kDataConfig) -> Path:
    return Path(cfg.cache_dir) / "downloads" / f"multi30k-{MULTI30K_COMMIT}"


def _fetch(url: str, cfg: Multi30kDataConfig, cache: Path, progress: bool) -> bytes:
    """The body at ``url``, all of it: a transfer cut short is an error, not a shorter file."""
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            expected = response.length
            chunks = []
            with tqdm(
                total=expected, unit="B", unit_scale=True, desc=url.rsplit("/", 1)[-1], disable=not progress
            ) as bar:
                while (chunk := response.read(1 << 16)) and bar.n <= MAX_BYTES:
                    chunks.append(chunk)
                    bar.update(len(chunk))
    except (urllib.error.URLError, http.client.HTTPException, OSError) as e:
        raise NMTError(_offline_message(cfg, cache, url, e)) from None
    body = b"".join(chunks)
    if len(body) > MAX_BYTES:
        raise NMTError(
            f"{url}: more than {MAX_BYTES >> 20} MB, far more than any Multi30k file; nothing was cached"
        )
    if expected is not None and len(body) < expected:
        raise NMTError(
            f"{url}: the transfer stopped after {len(body):,} of {expected:,} bytes; nothing was cached, "
            "run again to retry"
        )
    return body


def _offline_message(cfg: Multi30kDataConfig, cache: Path, url: str, error: Exception) -> str:
    reason = getattr(error, "reason", None) or error
    return (
        f"Multi30k is in neither data.dir={cfg.dir} nor {cache}, and {url} could not be fetched "
        f"({type(error).__name__}: {reason}): download "
        f"{cfg.url}/{{train,val,test_2016_flickr}}.{{en,de}}.gz, gunzip them into {cache}/ "
        "as {train,valid,test}.{en,de}, or point data.dir=... at a folder "
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


def _check(where: Path | str, text: bytes, name: str, where_kind: str = "") -> bytes:
    """``text`` when its SHA-256 is the one pinned for ``name``; else one line naming both digests."""
    got, want = hashlib.sha256(text).hexdigest(), MULTI30K_FILES[name][1]
    if got != want:
        hint = (
            "; data=multi30k reads Multi30k's official text only: use data=local data.dir=... for other text"
            if where_kind
            else "; nothing was cached"
        )
        raise NMTError(f"{where}: SHA-256 {got} does not match Multi30k's {name}, {want}{hint}")
    return text
