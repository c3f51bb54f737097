"""Errors an operator sees: one clear line and a non-zero exit (the CLI turns these into that)."""


class EtudeError(Exception):
    """Bad input or an environment problem the user can fix. Never shown as a traceback."""

    exit_code = 2


class NotFound(EtudeError):
    exit_code = 2
