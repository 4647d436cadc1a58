"""What every `omni` command shares: the help format and the errors-to-exit-codes wrapper."""

from __future__ import annotations

import re

import typer
from typer.core import TyperCommand

from omni_cli.errors import OmniError


class _Command(TyperCommand):
    """Typer's plain help, with a list argument's type written <path>... rather than <list[Path]>."""

    def format_help(self, ctx, formatter) -> None:
        super().format_help(ctx, formatter)
        formatter.buffer[:] = [re.sub(r"<list\[(\w+)\]>", lambda m: f"<{m.group(1).lower()}>...", piece)
                               for piece in formatter.buffer]


def _run(fn):
    """Call fn, turning user-facing errors into a message and an exit code."""
    try:
        return fn()
    except OmniError as e:
        typer.echo(f"omni: error: {e}", err=True)
        raise typer.Exit(e.exit_code) from None
