"""One exception type for everything a user can get wrong: bad input files, configs, checkpoints; and
what its messages may show of a URL."""

import re


class NMTError(Exception):
    """A user-facing error. The message says what is wrong and where (file, line, config key).

    Scripts print it on one line, without a traceback, and exit with status 1.
    """


_USERINFO = re.compile(r"(?<=[\w+.-]://)[^/?#\s]*@")  # the user:password@ of a URL (scheme://...)


def hide_credentials(text: str) -> str:
    """``text`` with the credentials of every URL in it masked (``https://***@host/...``): what a
    message, a log line or a saved config shows of a URL."""
    return _USERINFO.sub("***@", text)


def count_mismatch(given: int, expected: int, what: str, per: str) -> str | None:
    """The one message for a list that must hold one ``what`` per ``per`` and does not (None when it
    does): ``3 target prefixes for 2 sources: give one per source``."""
    if given == expected:
        return None
    return f"{given} {what} for {expected} {per}s: give one per {per}"
