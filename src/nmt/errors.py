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
