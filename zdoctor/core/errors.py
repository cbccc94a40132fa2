"""Errors that end a command with a one-line message and exit code 2."""

from __future__ import annotations


class ZdoctorError(Exception):
    """Base: the message is shown to the user as one line."""

    exit_code = 2


class UsageError(ZdoctorError):
    """The command line asks for something that cannot be done."""


class InputError(ZdoctorError):
    """A file given by the user is missing, unreadable or malformed."""
