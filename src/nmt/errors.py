"""One exception type for everything a user can get wrong: bad input files, configs, checkpoints."""


class NMTError(Exception):
    """A user-facing error. The message says what is wrong and where (file, line, config key).

    Scripts print it on one line, without a traceback, and exit with status 1.
    """
