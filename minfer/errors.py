"""The one exception type minfer raises for bad input: files, models, requests, options."""


class MinferError(Exception):
    """A user-facing error. The message names the file, tensor or field and what was expected.

    The CLI prints it without a traceback and exits with status 1.
    """
