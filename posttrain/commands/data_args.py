"""Data flags the commands that split prompts without a recipe share (eval, pairs)."""

from __future__ import annotations

import argparse


def add_holdout_flags(group: argparse._ArgumentGroup) -> None:
    """``--holdout`` (a share of scenarios) and ``--holdout-set`` (a shipped set, whole)."""
    group.add_argument(
        "--holdout", type=float, default=0.2, help="share of scenarios held out (default 0.2)"
    )
    group.add_argument(
        "--holdout-set",
        default=None,
        metavar="NAME",
        help="a prompt set the environment ships, held out whole instead of --holdout "
        "(refund: refund-holdout, 477 prompts)",
    )
