"""The one base of tuitune's user-facing errors: a one-sentence message and the exit status it
means on the command line (``tuitune.cli.exit_status`` maps every error by it).

``code``: the class's default, 1 for failed work, 2 for bad input; a class whose errors are either
takes it per instance (``SomeError(message, 2)``). A class that was a ValueError keeps ValueError
as its second base, so that ``except ValueError`` still catches it."""

from __future__ import annotations


class TuituneError(Exception):
    """A user-facing error: ``str(e)`` is one sentence, ``code`` its exit status."""

    code: int = 1

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        if code is not None:
            self.code = code


class CliError(TuituneError):
    """Bad usage or failed work, in one sentence; ``code`` is the exit status."""
