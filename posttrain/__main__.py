"""``python -m posttrain COMMAND ...``: the same as the ``posttrain`` command."""

from posttrain.cli import run

run()
