"""Errors that reach the user. The CLI boundary turns them into exit codes."""

from __future__ import annotations


class OmniError(Exception):
    """A problem the user can fix (bad config, bad input file, missing checkpoint).

    Raised anywhere below the CLI; ``omni_cli.cli`` prints the message and exits
    with ``exit_code`` instead of showing a traceback.
    """

    exit_code = 2


class ConfigError(OmniError):
    """A model config (YAML) that does not load: names the file and the key."""

    def __init__(self, path: object, key: str | None, message: str):
        where = f"{path}" if key is None else f"{path}: key '{key}'"
        super().__init__(f"{where}: {message}")
        self.path = path
        self.key = key


class RowError(ValueError):
    """One input row is invalid: names the row and the field.

    Not an OmniError: a bad row fails alone and is recorded in the manifest,
    the other rows still run.
    """

    def __init__(self, row: int, field: str | None, message: str):
        where = f"row {row}" if field is None else f"row {row}, field '{field}'"
        super().__init__(f"{where}: {message}")
        self.row = row
        self.field = field
