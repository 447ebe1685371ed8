"""The ``posttrain`` command: one entry point, one module per subcommand.

Each module in ``posttrain.commands`` exposes ``register(subparsers)``, which
adds its parser and sets ``func`` to the function that runs it. Adding a
subcommand is one new module plus one line in ``COMMAND_MODULES``.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import signal
import sys
import threading
from typing import NoReturn

from posttrain.commands.cpu_flag import add_numerics_flag, set_up_cpu_from_args
from posttrain.commands.env_flag import fold_env_args
from posttrain.errors import PosttrainError
from posttrain.interrupts import SIGTERM_EXIT_CODE, Terminated, interruptible
from posttrain.terminal import escaped_output

# subcommand modules, in the order `posttrain --help` lists them
COMMAND_MODULES = (
    "posttrain.commands.eval",
    "posttrain.commands.prompts",
    "posttrain.commands.sft",
    "posttrain.commands.grpo",
    "posttrain.commands.dpo",
    "posttrain.commands.pairs",
    "posttrain.commands.ui",
    "posttrain.commands.runs",
    "posttrain.commands.model",
    "posttrain.commands.serve",
    "posttrain.commands.env",
    "posttrain.commands.primitives_demo",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="posttrain",
        description="Turn one testable rule into a trained, measured agent.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    for command in subparsers.choices.values():  # every command: how torch computes
        for leaf in command_leaves(command):
            add_numerics_flag(leaf)
    return parser


def command_leaves(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The parsers that run something: ``parser`` itself, or the subcommands under it
    (``posttrain model build``), each of them in turn."""
    nested = [action for action in parser._actions
              if isinstance(action, argparse._SubParsersAction)]
    if not nested:
        return [parser]
    return [leaf for action in nested for sub in action.choices.values()
            for leaf in command_leaves(sub)]


def main(argv: list[str] | None = None) -> int:
    """Run one command; everything it prints is escaped (``posttrain.terminal``): the text
    of environments, servers, files and models reaches no terminal as control codes."""
    with escaped_output():
        return run_command(argv)


def run_command(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        fold_env_args(args)
        # before anything loads torch: the kernels, threads and waiting it computes with
        args.cpu_setup = set_up_cpu_from_args(args)
        with interruptible():  # a Ctrl-C that landed where Python drops it still stops here
            return int(args.func(args) or 0)
    except PosttrainError as error:
        print(f"posttrain {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as interrupt:
        print(f"posttrain {args.command}: interrupted", file=sys.stderr)
        return SIGTERM_EXIT_CODE if isinstance(interrupt, Terminated) else 130
    except (OSError, RuntimeError) as error:
        # a save that ran out of room (a checkpoint, the store, a model build): one line
        # that says what to do, not a library's traceback; the run is already marked
        full = disk_full(error)
        if full is None:
            raise
        print(f"posttrain {args.command}: error: {full}", file=sys.stderr)
        return 2


def run() -> NoReturn:
    """The ``posttrain`` command and ``python -m posttrain``: the process exits with the
    status ``main`` chose (130 after Ctrl-C, 143 after SIGTERM), never by the signal.

    Once ``main`` has said the command was interrupted, the interrupt is over. One that
    arrives after it (a second Ctrl-C, or a signal Python had not yet delivered when main
    returned) would otherwise raise in the exit's cleanup (an OpenEnv app's server
    stopping, threads joined) and end the process by SIGINT instead (seen once in CI: the
    OpenEnv Ctrl-C test read -2 after "interrupted" was printed)."""
    try:
        code = main()
    except KeyboardInterrupt as interrupt:  # landed while main was saying it stopped
        code = SIGTERM_EXIT_CODE if isinstance(interrupt, Terminated) else 130
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the command is over: only cleanup is left
    forget_uncaught_interrupt()
    if code in (130, SIGTERM_EXIT_CODE):
        exit_by_deadline(code, INTERRUPTED_CLEANUP_S)
    sys.exit(code)


#: what an interrupted command's cleanup gets before the process ends regardless
INTERRUPTED_CLEANUP_S = 1.5


def exit_by_deadline(code: int, seconds: float) -> None:
    """After an interrupt the command is over, and what is left gets ``seconds``: the exit's
    cleanup (a dashboard's last batch, a served app's stop) and the threads Python waits
    for at exit. A thread stuck in someone else's call (an OpenEnv step a hung server
    never answers, up to its ``timeout_s``) would otherwise keep the process alive after
    it said "interrupted"; past the deadline the process ends with ``code`` anyway."""
    def end() -> None:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)

    timer = threading.Timer(seconds, end)
    timer.daemon = True  # it runs while the exit waits for the others
    timer.start()


def forget_uncaught_interrupt() -> None:
    """Clear CPython's note that an interrupt went uncaught, which the interrupt ``main``
    caught may have left.

    CPython notes a KeyboardInterrupt that leaves code it runs from a string (``exec`` of
    source text: a dataclass's methods, a chat template, made at the moment the Ctrl-C
    lands) as uncaught, even when the code around it catches it later, and under
    ``python -m`` the interpreter then ends the process by SIGINT (status -2) whatever
    status ``sys.exit`` gave (CPython's Py_RunMain and its _Py_UnhandledKeyboardInterrupt;
    seen in the OpenEnv Ctrl-C test, about 1 run in 8 on a busy machine). Running source
    text again resets the note: it is set only when an interrupt leaves such code."""
    exec("pass")  # constant source text: resets the note, runs nothing


#: what a full disk or an exhausted quota says, as an errno or in a library's message
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
DISK_FULL_WORDS = ("No space left on device", "Disk quota exceeded", "database or disk is full")


def disk_full(error: BaseException) -> str | None:
    """One line for an error that means the disk (or the quota) is full, else None."""
    text = str(error)
    errno_full = isinstance(error, OSError) and error.errno in DISK_FULL_ERRNOS
    if not errno_full and not any(words in text for words in DISK_FULL_WORDS):
        return None
    where = getattr(error, "filename", None)
    place = f" while writing {where}" if where else ""
    return (f"no space left on the device{place}: free some space (or point --runs-dir and "
            "the model cache, POSTTRAIN_MODELS, at a larger disk) and run again; a run that "
            "was writing is marked failed")


if __name__ == "__main__":
    sys.exit(main())
