"""A free port of this machine, for a service started on it by a client in the same process (the server
benchmark, the tests)."""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
