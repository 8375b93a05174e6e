"""A stand-in for the Hugging Face hub: a local HTTP server that answers the endpoints huggingface_hub and
datasets call (repo info, tree, paths-info, ``resolve`` with HEAD and byte ranges), reached with
``HF_ENDPOINT=http://127.0.0.1:PORT``.

It serves ``wmt/wmt14`` laid out as the hub does at the pinned commit: the card's ``configs:`` block, a
``translation`` struct of ``de``/``en``, ``de-en/{train-0000{0,1,2}-of-00003,validation-00000-of-00001,
test-00000-of-00001}.parquet`` in 1,000-row groups as ``datasets`` wrote them when the hub converted the
dataset (``to_parquet(batch_size=1000)``). The text is WMT's (``../shared/data/wmt14-de-en``) when
present, else generated; small, so a test takes seconds. It counts the bytes it serves and records
every request, and can answer with an error status, stop answering, or misbehave as servers and
proxies do (a byte at a time, the whole file for a range, a captive portal's page).

It also serves small copies of the other datasets the presets read, each laid out as on the hub
(:mod:`hub_datasets`): ``add_repo`` adds one, with its parquet conversion (``refs/convert/parquet``)
and whether it is gated.
"""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import random
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from urllib.parse import parse_qs, unquote

REPO_ID = "wmt/wmt14"
PINNED = "b199e406369ec1b7634206d3ded5ba45de2fe696"  # data.revision's default
OTHER = "5e6ae1c1e4a2f0f7ac5a3c8b9d0e1f2a3b4c5d6e"  # another commit with the same files
MAIN = PINNED  # what the branch "main" points at
TRAIN_ROWS = (6000, 5000, 4000)  # a file per corpus, as the hub's split is written corpus after corpus
VALID_ROWS = TEST_ROWS = 300
ROW_GROUP = 1000
SHARED_WMT = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "wmt14-de-en"

CARD = """---
language:
- de
- en
configs:
- config_name: de-en
  data_files:
  - split: train
    path: de-en/train-*
  - split: validation
    path: de-en/validation-*
  - split: test
    path: de-en/test-*
dataset_info:
- config_name: de-en
  features:
  - name: translation
    dtype:
      translation:
        languages:
        - de
        - en
---

# Dataset Card for "wmt14" (a stand-in for tests)
"""


def _pairs(name: str, n: int, skip: int = 0) -> list[dict[str, str]]:
    """``n`` de/en pairs: WMT's text from the shared copy when present, else generated sentences."""
    if (SHARED_WMT / f"{name}.de").is_file():
        sides = {}
        for lang in ("de", "en"):
            with open(SHARED_WMT / f"{name}.{lang}", encoding="utf-8") as f:
                lines = [line.rstrip("\n") for _, line in zip(range(skip + n), f)]
            sides[lang] = lines[skip:]
        if len(sides["de"]) == n:
            return [{"de": de, "en": en} for de, en in zip(sides["de"], sides["en"])]
    rng = random.Random(f"{name}-{skip}")
    words = [f"w{i}" for i in range(300)]
    out = []
    for i in range(n):
        sentence = rng.choices(words, k=rng.randint(5, 30))
        out.append(
            {
                "de": f"{name} {skip + i} " + " ".join(sentence),
                "en": f"{name} {skip + i} " + " ".join(sentence[::-1]),
            }
        )
    return out


@cache
def dataset_files() -> dict[str, bytes]:
    """Path in the repository -> content: the tests' small dataset."""
    train, skip = [], 0
    for n in TRAIN_ROWS:
        train.append(_pairs("train", n, skip))
        skip += n
    return _files(train, _pairs("valid", VALID_ROWS), _pairs("test", TEST_ROWS))


def _files(train: list[list[dict]], valid: list[dict], test: list[dict]) -> dict[str, bytes]:
    import datasets

    files = {"README.md": CARD.encode()}
    for i, rows in enumerate(train):
        files[f"de-en/train-{i:05d}-of-{len(train):05d}.parquet"] = _parquet(datasets, rows)
    files["de-en/validation-00000-of-00001.parquet"] = _parquet(datasets, valid)
    files["de-en/test-00000-of-00001.parquet"] = _parquet(datasets, test)
    return files


def _parquet(datasets, rows: list[dict[str, str]]) -> bytes:
    features = datasets.Features({"translation": datasets.Translation(languages=["de", "en"])})
    buffer = io.BytesIO()
    datasets.Dataset.from_dict({"translation": rows}, features=features).to_parquet(
        buffer, batch_size=ROW_GROUP
    )
    return buffer.getvalue()


@dataclass
class Request:
    method: str
    path: str  # the URL's path, unquoted, with its query
    range: str | None
    body_bytes: int = 0


CONVERTED = "refs/convert/parquet"


@dataclass
class Repo:
    """A dataset repository: its files (the same at every commit of ``commits``), its branches, and its
    parquet conversion's files (at a commit of their own) when the hub made one."""

    files: dict[str, bytes]
    commits: tuple[str, ...]
    refs: dict[str, str]
    converted: dict[str, bytes] | None = None
    gated: bool = False  # answers 401 GatedRepo to a request without a token

    @property
    def converted_commit(self) -> str:
        return hashlib.sha1(repr(sorted(self.converted or {})).encode()).hexdigest()

    def commit_of(self, revision: str) -> str | None:
        revision = unquote(revision)
        if revision == CONVERTED and self.converted is not None:
            return self.converted_commit
        if revision in self.commits or (self.converted is not None and revision == self.converted_commit):
            return revision
        return self.refs.get(revision)

    def files_at(self, commit: str) -> dict[str, bytes]:
        return (
            self.converted if self.converted is not None and commit == self.converted_commit else self.files
        )


@dataclass
class StandIn:
    url: str
    files: dict[str, bytes]  # wmt/wmt14's
    requests: list[Request] = field(default_factory=list)
    refs: dict[str, str] = field(default_factory=lambda: {"main": MAIN})
    commits: tuple[str, ...] = (PINNED, OTHER)
    repos: dict[str, Repo] = field(default_factory=dict)
    fail_status: int | None = None  # every request answered with this status
    stall: bool = False  # every request waits, unanswered, until the server stops
    trickle_s: float = 0.0  # a file's bytes sent one at a time, this long apart
    ignore_range: bool = False  # a range request answered 200 with the whole file
    portal: bool = False  # every request answered 200 with a captive portal's login page
    cut: int = 0  # this many file bodies are cut off halfway (the connection closed), then served whole
    release: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.repos.setdefault(REPO_ID, Repo(self.files, self.commits, self.refs))

    def add_repo(self, repo: str, files: dict[str, bytes], converted: dict | None = None, **kwargs) -> Repo:
        """Serve ``repo`` (its main branch at a commit of its own)."""
        commit = hashlib.sha1(repo.encode()).hexdigest()
        self.repos[repo] = Repo(files, (commit,), {"main": commit}, converted, **kwargs)
        return self.repos[repo]

    @property
    def bytes_served(self) -> int:
        return sum(r.body_bytes for r in self.requests)

    @property
    def dataset_requests(self) -> list[Request]:
        """The requests for the dataset: not huggingface_hub's own (its user-agent registry)."""
        return [r for r in self.requests if r.path.startswith(("/api/datasets/", "/datasets/"))]

    def commit_of(self, revision: str, repo: str = REPO_ID) -> str | None:
        return self.repos[repo].commit_of(revision)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    hub: StandIn

    def log_message(self, *args) -> None:
        pass

    def do_HEAD(self) -> None:
        self._answer(head=True)

    def do_GET(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self._answer(body=self.rfile.read(length))

    def _answer(self, head: bool = False, body: bytes = b"") -> None:
        hub = self.hub
        request = Request(self.command, unquote(self.path), self.headers.get("Range"))
        hub.requests.append(request)
        if hub.stall:
            hub.release.wait(120)
            return
        if hub.fail_status:
            return self._json(request, {"error": "stand-in failure"}, hub.fail_status, head)
        if hub.portal:
            page = b"<!DOCTYPE html><html><head><title>Hotel WiFi - Sign in</title></head></html>"
            return self._send(request, 200, {"Content-Type": "text/html; charset=utf-8"}, page, head)
        path, _, query = self.path.partition("?")
        if path == "/api/agent-harnesses":  # huggingface_hub's user-agent registry, fetched once a day
            return self._json(request, {"standardEnvVars": ["AI_AGENT", "AGENT"], "harnesses": {}}, 200, head)
        m = re.fullmatch(r"/(api/)?datasets/([^/]+/[^/]+)(/.*)?", path)
        repo = hub.repos.get(unquote(m.group(2))) if m else None
        if repo is None:
            if path.startswith("/api/datasets/") or path.startswith("/datasets/"):
                return self._json(request, {"error": "Repository not found"}, 401, head, code="RepoNotFound")
            return self._json(request, {"error": "not found"}, 404, head)
        if repo.gated and not self.headers.get("Authorization"):
            message = {"error": "Access to this dataset is restricted. You must be authenticated."}
            return self._json(request, message, 401, head, code="GatedRepo")
        self.repo, rest = repo, m.group(3) or ""
        if m.group(1) and (r := re.fullmatch(r"(?:/revision/([^/]+))?", rest)):
            return self._repo_info(request, m.group(2), r.group(1) or "main", head)
        if m.group(1) and (r := re.fullmatch(r"/tree/([^/]+)(/.*)?", rest)):
            return self._tree(request, r.group(1), unquote((r.group(2) or "/")[1:]), parse_qs(query), head)
        if m.group(1) and (r := re.fullmatch(r"/paths-info/([^/]+)", rest)):
            return self._paths_info(request, r.group(1), body)
        if not m.group(1) and (r := re.fullmatch(r"/resolve/([^/]+)/(.+)", rest)):
            return self._resolve(request, r.group(1), unquote(r.group(2)), head)
        return self._json(request, {"error": "not found"}, 404, head)

    def _revision_missing(self, request: Request, revision: str, head: bool) -> None:
        message = {"error": f"Invalid rev id: {unquote(revision)}"}
        self._json(request, message, 404, head, code="RevisionNotFound")

    def _files(self, revision: str) -> dict[str, bytes] | None:
        commit = self.repo.commit_of(revision)
        return None if commit is None else self.repo.files_at(commit)

    def _repo_info(self, request: Request, repo_id: str, revision: str, head: bool) -> None:
        commit = self.repo.commit_of(revision)
        if commit is None:
            return self._revision_missing(request, revision, head)
        info = {
            "_id": "stand-in",
            "id": repo_id,
            "author": repo_id.split("/")[0],
            "sha": commit,
            "private": False,
            "gated": "auto" if self.repo.gated else False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": ["format:parquet"],
            "siblings": [{"rfilename": p} for p in sorted(self.repo.files_at(commit))],
            "lastModified": "2024-04-03T00:00:00.000Z",
            "createdAt": "2022-03-02T23:29:22.000Z",
        }
        self._json(request, info, 200, head)

    def _entry(self, path: str, files: dict[str, bytes]) -> dict:
        if path in files:
            data = files[path]
            return {"type": "file", "oid": _oid(data), "size": len(data), "path": path}
        return {"type": "directory", "oid": _oid(path.encode()), "size": 0, "path": path}

    def _tree(self, request: Request, revision: str, folder: str, query: dict, head: bool) -> None:
        files = self._files(revision)
        if files is None:
            return self._revision_missing(request, revision, head)
        recursive = query.get("recursive", ["false"])[0].lower() == "true"
        prefix = f"{folder.rstrip('/')}/" if folder else ""
        entries: dict[str, dict] = {}
        for path in files:
            if not path.startswith(prefix):
                continue
            rest = path[len(prefix) :].split("/")
            if recursive:
                for depth in range(1, len(rest)):
                    folder_path = prefix + "/".join(rest[:depth])
                    entries.setdefault(folder_path, self._entry(folder_path, files))
                entries[path] = self._entry(path, files)
            else:
                child = prefix + rest[0]
                entries[child] = self._entry(child, files)
        if folder and not entries:
            return self._json(request, {"error": f"{folder} does not exist"}, 404, head, code="EntryNotFound")
        self._json(request, [entries[p] for p in sorted(entries)], 200, head)

    def _paths_info(self, request: Request, revision: str, body: bytes) -> None:
        files = self._files(revision)
        if files is None:
            return self._revision_missing(request, revision, False)
        try:
            paths = json.loads(body).get("paths", [])
        except ValueError:
            paths = parse_qs(body.decode()).get("paths", [])
        known = [p for p in paths if p in files or any(f.startswith(p.rstrip("/") + "/") for f in files)]
        self._json(request, [self._entry(p, files) for p in known], 200, False)

    def _resolve(self, request: Request, revision: str, path: str, head: bool) -> None:
        commit = self.repo.commit_of(revision)
        if commit is None:
            return self._revision_missing(request, revision, head)
        files = self.repo.files_at(commit)
        if path not in files:
            return self._json(request, {"error": "Entry not found"}, 404, head, code="EntryNotFound")
        data = files[path]
        headers = {
            "ETag": f'"{_oid(data)}"',
            "X-Repo-Commit": commit,
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        status, body = 200, data
        if self.hub.ignore_range:
            return self._send(request, status, headers, body, head)
        if m := re.fullmatch(r"bytes=(\d*)-(\d*)", request.range or ""):
            if m.group(1):
                start, end = int(m.group(1)), min(int(m.group(2) or len(data) - 1), len(data) - 1)
            else:  # the last N bytes
                start, end = max(0, len(data) - int(m.group(2))), len(data) - 1
            if start >= len(data) or start > end:
                return self._send(request, 416, {"Content-Range": f"bytes */{len(data)}"}, b"", head)
            status, body = 206, data[start : end + 1]
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
        self._send(request, status, headers, body, head)

    def _json(self, request: Request, value, status: int, head: bool, code: str | None = None) -> None:
        headers = {"Content-Type": "application/json"}
        if code:
            headers["X-Error-Code"] = code
            headers["X-Error-Message"] = value.get("error", "")
        self._send(request, status, headers, json.dumps(value).encode(), head)

    def _send(self, request: Request, status: int, headers: dict, body: bytes, head: bool) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if head:
            return
        if self.hub.cut and headers.get("Content-Type") == "application/octet-stream" and len(body) > 1:
            self.hub.cut -= 1
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            request.body_bytes = len(body) // 2
            return
        if self.hub.trickle_s and headers.get("Content-Type") == "application/octet-stream":
            with suppress(OSError):  # the client gave up
                for i in range(len(body)):
                    self.wfile.write(body[i : i + 1])
                    self.wfile.flush()
                    request.body_bytes += 1
                    time.sleep(self.hub.trickle_s)
            return
        self.wfile.write(body)
        request.body_bytes = len(body)


def _oid(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


@contextmanager
def serve(files: dict[str, bytes]) -> Iterator[StandIn]:
    """A stand-in serving ``files`` until the generator is closed."""
    handler = type("Handler", (_Handler,), {})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.block_on_close = False
    hub = StandIn(url=f"http://127.0.0.1:{server.server_address[1]}", files=files)
    handler.hub = hub
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        hub.release.set()
        server.shutdown()
        server.server_close()


def standin_hub(tmp_path, monkeypatch) -> Iterator[StandIn]:
    """For a fixture: the stand-in, reached through HF_ENDPOINT (also by subprocesses), with every
    Hugging Face cache in ``tmp_path/hf_home``."""
    import huggingface_hub

    from nmt.data import hub_api as hub
    from nmt.data import sources

    with serve(dataset_files()) as standin:
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.setenv("HF_ENDPOINT", standin.url)
        monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", standin.url)  # read when imported
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        for name in ("HF_HOME", "HF_HUB_CACHE", "HF_DATASETS_CACHE", "HF_XET_CACHE"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
        monkeypatch.setattr(sources.hub, "_RESOLVED", {})  # what this process asked of other servers
        monkeypatch.setattr(hub, "_SEEN", {})
        monkeypatch.setattr(sources.hub, "_DRAWN", {})
        yield standin


def main() -> None:
    """Serve a larger copy until interrupted, then print what was served: each training file is the
    shared WMT training text and extra dev sets (33,071 pairs; 99,213 in the three files), validation
    and test are newstest2013/2014 whole."""
    import signal
    import sys

    def corpus() -> list[dict]:
        return _pairs("train", 20_000) + _pairs("extra-newstest2008-2012", 13_071)

    files = _files([corpus() for _ in range(3)], _pairs("valid", 3000), _pairs("test", 3003))
    with serve(files) as standin:
        print(f"HF_ENDPOINT={standin.url}", flush=True)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        with suppress(KeyboardInterrupt, SystemExit):
            signal.pause()
        sizes = {p: len(c) for p, c in files.items()}
        print(f"{len(standin.requests)} requests, {standin.bytes_served:,} bytes served", flush=True)
        for path, size in sizes.items():
            served = sum(r.body_bytes for r in standin.requests if r.path.endswith("/" + path))
            print(f"  {path}: {served:,} of {size:,} bytes", flush=True)


if __name__ == "__main__":
    main()
