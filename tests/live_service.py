"""The service under uvicorn in a background thread, for clients in the test's own process (the load and
browser tests). Apart from helpers.py: it needs the ``serve`` extra, which the unit tests do not."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

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


def chromium() -> tuple[str, str] | None:
    """Chromium and its driver, if both are installed."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


NO_BROWSER = "no chromium and chromedriver (Debian: apt-get install chromium chromium-driver)"


@contextmanager
def headless_chromium(profile: Path, size: str = "1100,1000") -> Iterator[Any]:
    """A headless Chromium driven by selenium, with its own profile folder, quit when the block ends."""
    import pytest

    webdriver = pytest.importorskip("selenium.webdriver")
    found = chromium()
    assert found is not None, NO_BROWSER
    browser, driver_path = found
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        f"--window-size={size}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()
