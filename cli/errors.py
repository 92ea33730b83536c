"""Errors a CLI command raises for user mistakes: printed as one line, exit status 1."""


class CliError(Exception):
    """A user-facing error; the message says what is wrong and how to fix it."""
