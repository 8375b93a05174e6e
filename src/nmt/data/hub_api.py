"""A dataset on the Hugging Face hub at one commit: the commit a revision names, the files of a split
(from the dataset card's ``configs:``, or laid out as the hub's parquet conversion writes them), and
byte ranges of those files.

Every request names the commit, never a branch, so a corpus drawn today is the corpus drawn next year
(a branch is resolved to its commit once, first). Requests go through huggingface_hub's HTTP session
(its endpoint ``HF_ENDPOINT``, token and error types) with a timeout and a few retries; nothing is
written to the hub's or ``datasets``' caches. The endpoints are the hub's own: repo info
(``/api/datasets/{repo}/revision/{rev}``), tree (``/api/datasets/{repo}/tree/{commit}/{folder}``) and
``resolve`` with a ``Range`` header.

Servers and proxies that misbehave fail in one line: each request has a deadline however slowly its
bytes come (``deadline_s``), a server that ignores ``Range`` and sends a whole file is noticed (a small
file is then read once, a large one refused), and an HTML page where JSON or a dataset card was
expected (a captive portal) is reported as what it is.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from nmt.errors import NMTError

log = logging.getLogger(__name__)

COMMIT = re.compile(r"[0-9a-f]{40}")
_FRONT_MATTER = re.compile(r"\A---[ \t]*\r?\n(.*?)\r?\n---[ \t]*(\r?\n|\Z)", re.DOTALL)
_TITLE = re.compile(rb"<title[^>]*>(.*?)</title>", re.IGNORECASE | re.DOTALL)
WHOLE_FILE_BYTES = 64 << 20  # a file sent whole though a range was asked: read once up to this size


@dataclass(frozen=True)
class Hub:
    """A dataset repository on the hub, reached with a per-read ``timeout_s``, ``retries`` and a
    whole-request ``deadline_s``."""

    repo: str
    timeout_s: float
    retries: int
    deadline_s: float = 600.0

    @property
    def endpoint(self) -> str:
        from huggingface_hub import constants

        return constants.ENDPOINT  # read per call: HF_ENDPOINT as huggingface_hub understood it

    def get(
        self, url: str, headers: dict | None = None, params: dict | None = None, limit: int = -1
    ) -> Answer:
        """A GET through huggingface_hub's session, retried on network errors and 5xx (also when they
        cut the body short), raised on errors; its body read as it comes, within ``deadline_s`` a try
        and, for a ``limit`` >= 0, ``limit`` bytes."""
        for attempt in range(self.retries + 1):
            try:
                return self._get(url, headers, params, limit)
            except _BodyCut as cut:
                if attempt == self.retries:
                    raise cut.error from None
                time.sleep(min(2**attempt, 8))
        raise AssertionError("unreachable")

    def _get(self, url: str, headers: dict | None, params: dict | None, limit: int) -> Answer:
        from huggingface_hub.utils import build_hf_headers, hf_raise_for_status, http_stream_backoff

        started = time.monotonic()
        headers = {**build_hf_headers(), **(headers or {})}
        with http_stream_backoff(
            "GET", url, headers=headers, params=params, timeout=self.timeout_s, max_retries=self.retries
        ) as response:
            if response.status_code >= 400:
                response.read()
                hf_raise_for_status(response)
            answer = Answer(url, response.status_code, response.headers, b"", response.links)
            if limit >= 0 and answer.status == 200 and (answer.length or 0) > limit:
                return answer  # the caller refuses it: nothing of the body is read
            chunks, received = [], 0
            try:
                for chunk in response.iter_bytes():
                    received += len(chunk)
                    if time.monotonic() - started > self.deadline_s:
                        raise NMTError(
                            f"{url}: {received:,} bytes in {self.deadline_s:g} s, and not finished "
                            "(data.hub_deadline_s): the server or a proxy sends too slowly; run again to "
                            "retry"
                        )
                    chunks.append(chunk)
            except _network_errors() as e:
                raise _BodyCut(e) from None
            answer.body = b"".join(chunks)
            return answer

    def json(self, url: str, params: dict | None = None) -> Answer:
        """A GET whose answer must be JSON: anything else (a captive portal's page) is said as what it is."""
        answer = self.get(url, params=params)
        try:
            answer.value = json.loads(answer.body)
        except ValueError:
            raise NMTError(f"{url}: expected the hub's JSON, got {answer.looks_like()}") from None
        return answer

    def commit(self, revision: str) -> str:
        """The commit ``revision`` (a branch, tag or commit) names."""
        url = f"{self.endpoint}/api/datasets/{self.repo}/revision/{quote(revision, safe='')}"
        value = self.json(url).value
        sha = value.get("sha") if isinstance(value, dict) else None
        if not isinstance(sha, str) or not COMMIT.fullmatch(sha):
            raise NMTError(f"{self.repo}: the hub named no commit for revision {revision!r} (got {sha!r})")
        return sha

    def card(self, commit: str) -> dict:
        """The YAML header of the dataset card (README.md) at ``commit``, {} without one: asked once per
        process (a commit never changes). An HTML page in its place is refused, said as what it is."""
        import yaml
        from huggingface_hub import errors

        key = (self.endpoint, self.repo, commit, "README.md", False)
        if key not in _SEEN:
            try:
                answer = self.file(commit, "README.md").answer()
            except errors.EntryNotFoundError:  # the parquet conversion's revision has no card
                _SEEN[key] = {}
                return _SEEN[key]
            if answer.is_html():
                raise NMTError(f"{answer.url}: expected the dataset card, got {answer.looks_like()}")
            match = _FRONT_MATTER.match(answer.body.decode("utf-8", errors="replace"))
            _SEEN[key] = (yaml.safe_load(match.group(1)) or {}) if match else {}
        return _SEEN[key]

    def tree(self, commit: str, folder: str, recursive: bool) -> dict[str, int]:
        """Path -> size of the files under ``folder`` at ``commit`` (every page of the listing), asked
        once per process; {} for a folder that is not there."""
        from huggingface_hub import errors

        key = (self.endpoint, self.repo, commit, folder, recursive)
        if key not in _SEEN:
            try:
                _SEEN[key] = self._list(commit, folder, recursive)
            except errors.EntryNotFoundError:
                _SEEN[key] = {}
        return _SEEN[key]

    def _list(self, commit: str, folder: str, recursive: bool) -> dict[str, int]:
        path = "/" + quote(folder, safe="") if folder else ""
        url: str | None = f"{self.endpoint}/api/datasets/{self.repo}/tree/{commit}{path}"
        params: dict | None = {"recursive": recursive}
        files: dict[str, int] = {}
        while url:
            answer = self.json(url, params=params)
            entries = answer.value if isinstance(answer.value, list) else []
            files.update({e["path"]: int(e["size"]) for e in entries if e.get("type") == "file"})
            url, params = answer.links.get("next", {}).get("url"), None  # the next link has the params
        return files

    def folders(self, commit: str) -> list[str]:
        """The top-level folders at ``commit``: the configs of a parquet conversion."""
        return sorted({path.split("/")[0] for path in self.tree(commit, "", True) if "/" in path})

    def file(self, commit: str, path: str, size: int = -1) -> HubFile:
        return HubFile(self, commit, path, size)

    def has_parquet(self, commit: str, config_name: str, split: str) -> bool:
        """Whether ``split`` of ``config_name`` is parquet files at ``commit`` (a card config, or the
        parquet conversion's layout); False when neither names the config, or its files are not parquet."""
        if not self._card_config(commit, config_name) and not self._converted(commit, config_name, split):
            return False
        return all(f.path.endswith(".parquet") for f in self.split_files(commit, config_name, split))

    def card_configs(self, commit: str) -> list[str]:
        """The config names of the card's ``configs:`` block ([] without one)."""
        return [
            str(c.get("config_name")) for c in self.card(commit).get("configs") or [] if isinstance(c, dict)
        ]

    def _card_config(self, commit: str, config_name: str) -> dict | None:
        configs = self.card(commit).get("configs") or []
        return next((c for c in configs if isinstance(c, dict) and c.get("config_name") == config_name), None)

    def _converted(self, commit: str, config_name: str, split: str) -> dict[str, int]:
        """The parquet conversion's files of a split: ``{config}/{split}/*.parquet``."""
        return {
            path: size
            for path, size in self.tree(commit, f"{config_name}/{split}", False).items()
            if path.endswith(".parquet")
        }

    def split_files(self, commit: str, config_name: str, split: str) -> list[HubFile]:
        """The files of ``split`` of the card's config ``config_name``, sorted by path (as ``datasets``
        resolves its ``data_files`` patterns: ``*`` within a folder, ``**`` across), or those of the
        parquet conversion's layout when the card has no such config."""
        config = self._card_config(commit, config_name)
        if config is None:
            converted = self._converted(commit, config_name, split)
            if converted:
                return [self.file(commit, p, converted[p]) for p in sorted(converted)]
            configs = [
                c.get("config_name") for c in self.card(commit).get("configs") or [] if isinstance(c, dict)
            ]
            names = configs or self.folders(commit)
            if config_name in names:
                raise NMTError(
                    f"{self.repo}@{commit}: config {config_name!r} has no split {split!r}; check "
                    "data.train_split, data.valid_split and data.test_split (null: drawn from train)"
                )
            raise NMTError(
                f"{self.repo}@{commit}: no config {config_name!r}; it has "
                f"{', '.join(map(str, names)) or 'none'}; check data.config_name"
            )
        patterns = _split_patterns(config.get("data_files"), split)
        if not patterns:
            raise NMTError(
                f"{self.repo}@{commit}: config {config_name!r} has no split {split!r}; check "
                "data.train_split, data.valid_split and data.test_split (null: drawn from train)"
            )
        found: dict[str, int] = {}
        for pattern in patterns:
            regex = _glob_regex(pattern)
            found.update(
                {p: s for p, s in self.tree(commit, *_listing_of(pattern)).items() if regex.fullmatch(p)}
            )
        if not found:
            raise NMTError(
                f"{self.repo}@{commit}: no file matches {patterns} (split {split!r} of {config_name!r})"
            )
        return [self.file(commit, p, found[p]) for p in sorted(found)]


class _BodyCut(Exception):
    """A network error while a body was read (after the client's own retries, which cover the start)."""

    def __init__(self, error: Exception):
        super().__init__(str(error))
        self.error = error


def _network_errors() -> tuple[type[Exception], ...]:
    """The errors huggingface_hub's client retries (timeouts, network and protocol errors)."""
    import inspect

    from huggingface_hub.utils import http_backoff

    errors = inspect.signature(http_backoff).parameters["retry_on_exceptions"].default
    return errors if isinstance(errors, tuple) else (errors,)


@dataclass
class Answer:
    """What a server sent: status, headers, body."""

    url: str
    status: int
    headers: Any
    body: bytes
    links: Any
    value: Any = None  # the body as JSON, when asked for

    @property
    def length(self) -> int | None:
        value = self.headers.get("Content-Length")
        return int(value) if value and value.isdigit() else None

    def is_html(self) -> bool:
        kind = (self.headers.get("Content-Type") or "").lower()
        return "text/html" in kind or self.body.lstrip()[:15].lower().startswith(
            (b"<!doctype html", b"<html")
        )

    def looks_like(self) -> str:
        """The body in a few words: an HTML page and its title, or its first bytes."""
        if self.is_html():
            title = _TITLE.search(self.body)
            named = f" titled {title.group(1).decode('utf-8', 'replace').strip()[:80]!r}" if title else ""
            return (
                f"an HTML page{named} (HTTP {self.status}): a captive portal or a proxy answered instead of "
                "the hub; log in to the network, or set HF_ENDPOINT to a hub that answers"
            )
        return f"{len(self.body):,} bytes of something else (HTTP {self.status}, starting {self.body[:40]!r})"


# (endpoint, repo, commit, path, recursive) -> the card or a listing: what a commit holds never changes
_SEEN: dict[tuple[str, str, str, str, bool], Any] = {}


class HubFile:
    """One file of the repository at a commit, read by byte range (``resolve`` with ``Range``)."""

    def __init__(self, hub: Hub, commit: str, path: str, size: int):
        self.hub, self.path, self.size = hub, path, size
        self.name = f"hf://datasets/{hub.repo}@{commit}/{path}"
        self.url = f"{hub.endpoint}/datasets/{hub.repo}/resolve/{commit}/{quote(path)}"
        self._whole: bytes | None = None  # the file, when a server sent it whole instead of a range

    def fetch(self, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end``. A server that ignores ``Range`` (200 and the whole file) is
        noticed before its body is read: a file up to ``WHOLE_FILE_BYTES`` is then read once and kept,
        logged; a larger one is refused, as every range would fetch all of it again."""
        if self._whole is not None:
            return self._whole[start:end]
        answer = self.hub.get(self.url, headers={"Range": f"bytes={start}-{end - 1}"}, limit=WHOLE_FILE_BYTES)
        if answer.status == 206:
            return answer.body
        if answer.is_html():
            raise NMTError(f"{self.url}: expected bytes of {self.path}, got {answer.looks_like()}")
        if not answer.body and (answer.length or 0) > WHOLE_FILE_BYTES:
            raise NMTError(
                f"{self.url}: the server (or a proxy) ignores byte ranges: it answered a range of "
                f"{end - start:,} bytes with the whole file ({answer.length:,} bytes); refused, as every row "
                "group would fetch all of it; use another connection, or a copy of the files with "
                "data.data_files=..."
            )
        log.warning(
            "%s: the server ignores byte ranges (it sent the whole file, %s bytes): read once and kept",
            self.name,
            f"{len(answer.body):,}",
        )
        self._whole = answer.body
        return answer.body[start:end]

    def answer(self) -> Answer:
        return self.hub.get(self.url)


def _split_patterns(data_files: Any, split: str) -> list[str]:
    """The path patterns of ``split`` in a card config's ``data_files`` (a list of {split, path}, a
    dict split -> path(s), or path(s) meaning the train split)."""
    if isinstance(data_files, dict):
        paths: Any = data_files.get(split)
    elif isinstance(data_files, list) and all(isinstance(e, dict) for e in data_files):
        paths = [p for e in data_files if e.get("split") == split for p in _as_list(e.get("path"))]
    else:
        paths = data_files if split == "train" else None
    return [str(p) for p in _as_list(paths)]


def _as_list(value: Any) -> list:
    return [] if value is None else list(value) if isinstance(value, list) else [value]


def _listing_of(pattern: str) -> tuple[str, bool]:
    """The folder to list for a pattern (its part before the first wildcard), and whether recursively."""
    wild = re.search(r"[*?\[]", pattern)
    fixed = pattern if wild is None else pattern[: wild.start()]
    folder = fixed.rsplit("/", 1)[0] if "/" in fixed else ""
    return folder, "/" in pattern[len(folder) + 1 if folder else 0 :] or "**" in pattern


def _glob_regex(pattern: str) -> re.Pattern:
    parts = re.split(r"(\*\*|\*|\?)", pattern)
    wildcards = {"**": ".*", "*": "[^/]*", "?": "[^/]"}
    return re.compile("".join(wildcards.get(p, re.escape(p)) for p in parts))
