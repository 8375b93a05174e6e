"""The service under uvicorn in a background thread, for clients in the test's own process (the load and
browser tests). Apart from helpers.py: it needs the ``serve`` extra, which the unit tests do not."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from fastapi import FastAPI

from nmt.serve import listen


@contextmanager
def serve_in_thread(app: FastAPI, host: str = "127.0.0.1", timeout_s: float = 60) -> Iterator[str]:
    """Run ``app`` as scripts/serve.py does (uvicorn on a socket from :func:`nmt.serve.listen`), on
    ``host`` and a free port, in a thread until the block ends; yields its base URL."""
    sock = listen(host, 0)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError(f"the server did not start on {host}:{port}")
        time.sleep(0.05)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=timeout_s)
        sock.close()
