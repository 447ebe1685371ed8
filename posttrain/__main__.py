"""``python -m posttrain COMMAND ...``: the same as the ``posttrain`` command."""

import sys

from posttrain.cli import main

sys.exit(main())
