"""Errors that reach the user. The CLI boundary turns them into exit codes."""

from __future__ import annotations

from omni_cli.runners.errors import ConfigError, OmniError

__all__ = ["ConfigError", "OmniError", "RowError"]


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
