"""A dataset on the Hugging Face hub at one commit: the commit a revision names, the files of a split
(from the dataset card's ``configs:``), and byte ranges of those files.

Every request names the commit, never a branch, so a corpus drawn today is the corpus drawn next year
(a branch is resolved to its commit once, first). Requests go through huggingface_hub's HTTP session
(its endpoint ``HF_ENDPOINT``, token and error types) with a timeout and a few retries; nothing is
written to the hub's or ``datasets``' caches. The endpoints are the hub's own: repo info
(``/api/datasets/{repo}/revision/{rev}``), tree (``/api/datasets/{repo}/tree/{commit}/{folder}``) and
``resolve`` with a ``Range`` header.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from nmt.errors import NMTError

log = logging.getLogger(__name__)

COMMIT = re.compile(r"[0-9a-f]{40}")
_FRONT_MATTER = re.compile(r"\A---[ \t]*\r?\n(.*?)\r?\n---[ \t]*(\r?\n|\Z)", re.DOTALL)


@dataclass(frozen=True)
class Hub:
    """A dataset repository on the hub, reached with a per-request ``timeout_s`` and ``retries``."""

    repo: str
    timeout_s: float
    retries: int

    @property
    def endpoint(self) -> str:
        from huggingface_hub import constants

        return constants.ENDPOINT  # read per call: HF_ENDPOINT as huggingface_hub understood it

    def get(self, url: str, **kwargs: Any) -> Any:
        """A GET through huggingface_hub's session, retried on network errors and 5xx, raised on errors."""
        from huggingface_hub.utils import build_hf_headers, hf_raise_for_status, http_backoff

        headers = {**build_hf_headers(), **kwargs.pop("headers", {})}
        response = http_backoff(
            "GET", url, headers=headers, timeout=self.timeout_s, max_retries=self.retries, **kwargs
        )
        hf_raise_for_status(response)
        return response

    def commit(self, revision: str) -> str:
        """The commit ``revision`` (a branch, tag or commit) names."""
        url = f"{self.endpoint}/api/datasets/{self.repo}/revision/{quote(revision, safe='')}"
        sha = self.get(url).json().get("sha")
        if not isinstance(sha, str) or not COMMIT.fullmatch(sha):
            raise NMTError(f"{self.repo}: the hub named no commit for revision {revision!r} (got {sha!r})")
        return sha

    def card(self, commit: str) -> dict:
        """The YAML header of the dataset card (README.md) at ``commit``: asked once per process (a
        commit never changes)."""
        import yaml

        key = (self.endpoint, self.repo, commit, "README.md", False)
        if key not in _SEEN:
            text = self.file(commit, "README.md").fetch_all().decode("utf-8")
            match = _FRONT_MATTER.match(text)
            _SEEN[key] = (yaml.safe_load(match.group(1)) or {}) if match else {}
        return _SEEN[key]

    def tree(self, commit: str, folder: str, recursive: bool) -> dict[str, int]:
        """Path -> size of the files under ``folder`` at ``commit`` (every page of the listing), asked
        once per process."""
        key = (self.endpoint, self.repo, commit, folder, recursive)
        if key not in _SEEN:
            _SEEN[key] = self._list(commit, folder, recursive)
        return _SEEN[key]

    def _list(self, commit: str, folder: str, recursive: bool) -> dict[str, int]:
        path = "/" + quote(folder, safe="") if folder else ""
        url: str | None = f"{self.endpoint}/api/datasets/{self.repo}/tree/{commit}{path}"
        params: dict | None = {"recursive": recursive}
        files: dict[str, int] = {}
        while url:
            response = self.get(url, params=params)
            files.update({e["path"]: int(e["size"]) for e in response.json() if e.get("type") == "file"})
            url, params = response.links.get("next", {}).get("url"), None  # the next link has the params
        return files

    def file(self, commit: str, path: str, size: int = -1) -> HubFile:
        return HubFile(self, commit, path, size)

    def split_files(self, commit: str, config_name: str, split: str) -> list[HubFile]:
        """The files of ``split`` of the card's config ``config_name``, sorted by path (as ``datasets``
        resolves its ``data_files`` patterns: ``*`` within a folder, ``**`` across)."""
        configs = self.card(commit).get("configs") or []
        config = next(
            (c for c in configs if isinstance(c, dict) and c.get("config_name") == config_name), None
        )
        if config is None:
            names = [c.get("config_name") for c in configs if isinstance(c, dict)]
            raise NMTError(
                f"{self.repo}@{commit}: the dataset card has no config {config_name!r} (it has "
                f"{', '.join(map(str, names)) or 'no configs: block'}); check data.config_name"
            )
        patterns = _split_patterns(config.get("data_files"), split)
        if not patterns:
            raise NMTError(
                f"{self.repo}@{commit}: config {config_name!r} has no split {split!r}; check "
                "data.train_split, data.valid_split and data.test_split"
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


# (endpoint, repo, commit, path, recursive) -> the card or a listing: what a commit holds never changes
_SEEN: dict[tuple[str, str, str, str, bool], Any] = {}


class HubFile:
    """One file of the repository at a commit, read by byte range (``resolve`` with ``Range``)."""

    def __init__(self, hub: Hub, commit: str, path: str, size: int):
        self.hub, self.path, self.size = hub, path, size
        self.name = f"hf://datasets/{hub.repo}@{commit}/{path}"
        self.url = f"{hub.endpoint}/datasets/{hub.repo}/resolve/{commit}/{quote(path)}"

    def fetch(self, start: int, end: int) -> bytes:
        response = self.hub.get(self.url, headers={"Range": f"bytes={start}-{end - 1}"})
        if response.status_code == 206:
            return response.content
        return response.content[start:end]  # a server that ignores ranges sends the whole file

    def fetch_all(self) -> bytes:
        return self.hub.get(self.url).content


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
