"""Errors the device layer raises for problems a user can fix.

They are defined here, below the CLI, so that runners/ needs nothing from
omni_cli/; the CLI re-exports them and turns them into exit codes at its
boundary (omni_cli/cli.py).
"""

from __future__ import annotations


class OmniError(Exception):
    """A problem the user can fix (bad config, bad input file, missing checkpoint): the CLI
    prints the message and exits with ``exit_code`` instead of showing a traceback."""

    exit_code = 2


class ConfigError(OmniError):
    """A config file (the YAML, a checkpoint's config.json) that does not load: names the file and the key."""

    def __init__(self, path: object, key: str | None, message: str):
        where = f"{path}" if key is None else f"{path}: key '{key}'"
        super().__init__(f"{where}: {message}")
        self.path = path
        self.key = key
