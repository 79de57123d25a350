"""``python -m orchestry.cli``: the ``orchestry`` command."""

from orchestry.cli import app

app()
