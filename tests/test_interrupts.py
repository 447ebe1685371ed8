"""SIGTERM and an inherited, ignored SIGINT both reach a recipe as an interrupt, also when
the signal lands where Python drops the exception it raises."""

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from posttrain.interrupts import Terminated, handled, interruptible
from posttrain.progress import progress_bar


def test_sigterm_inside_raises_terminated_and_the_old_handler_comes_back():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated) as caught, interruptible():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises before this returns; if not, the test fails
    assert handled(caught.value) == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before


def test_ctrl_c_works_even_when_the_process_started_with_sigint_ignored():
    saved = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with pytest.raises(KeyboardInterrupt) as caught, interruptible():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the handler raises before this returns; if not, the test fails
        assert handled(caught.value) == "Ctrl-C"
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # put back as it was
    finally:
        signal.signal(signal.SIGINT, saved)


class _SignalsWhileCollected:
    """Sends a signal from ``__del__``: the handler then runs inside the finalizer, where
    Python prints "Exception ignored" and drops what it raises (as when garbage collection
    runs a weakref callback at the moment Ctrl-C arrives)."""

    def __init__(self, signum):
        self.signum = signum

    def __del__(self):
        os.kill(os.getpid(), self.signum)
        time.sleep(0.2)  # the handler runs here, inside the finalizer


def _lose_a_signal(signum):
    _SignalsWhileCollected(signum)  # dropped at once: __del__ runs now, on this line


@pytest.mark.parametrize("signum, kind", [(signal.SIGINT, KeyboardInterrupt),
                                          (signal.SIGTERM, Terminated)])
def test_a_signal_python_dropped_is_raised_at_the_next_progress_update(signum, kind,
                                                                      monkeypatch):
    dropped = []
    monkeypatch.setattr(sys, "unraisablehook", lambda info: dropped.append(info.exc_type))
    reached = []
    with pytest.raises(kind) as caught, interruptible():
        _lose_a_signal(signum)
        assert dropped == [kind]  # Python did drop it
        reached.append("after the finalizer")
        for enabled in (False, True):
            with progress_bar("work", 10, enabled=enabled) as update:
                update(1)
                reached.append("after an update")
    assert reached == ["after the finalizer"]
    assert type(caught.value) is kind
    # handled: nothing is raised again
    with interruptible():
        with progress_bar("work", 10, enabled=False) as update:
            update(1)


def test_a_dropped_signal_with_no_checkpoint_is_raised_when_the_block_ends(monkeypatch):
    monkeypatch.setattr(sys, "unraisablehook", lambda info: None)
    finished = []
    with pytest.raises(KeyboardInterrupt), interruptible():
        _lose_a_signal(signal.SIGINT)
        finished.append(True)
    assert finished == [True]
    with interruptible():  # raised once, not again
        pass


def test_an_interrupt_the_code_handled_itself_is_not_raised_again():
    with interruptible():
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
        except KeyboardInterrupt as interrupt:
            assert handled(interrupt) == "Ctrl-C"  # what a recipe does: stop, keep, go on
        with progress_bar("finish", 3, enabled=False) as update:
            update(3)


def _run_the_command_with(main_source, as_module: bool = False):
    """``posttrain.cli.run`` in a process of its own, with ``main`` replaced by the function
    ``main_source`` defines: the process's exit status and standard error. ``as_module``:
    started as ``python -m`` starts posttrain (a module of its own), not with ``-c``."""
    import subprocess
    import tempfile
    import textwrap

    # Python's own Ctrl-C handler, as a command started from a terminal has it: a suite
    # started in the background of a script (or under nohup) hands its processes SIGINT
    # ignored, Python keeps an ignore it inherits, and the stand-in's Ctrl-C would vanish
    script = ("import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
              + textwrap.dedent(main_source)
              + "\nimport posttrain.cli as cli\ncli.main = main\ncli.run()\n")
    with tempfile.TemporaryDirectory() as folder:
        if as_module:
            (Path(folder) / "stand_in.py").write_text(script)
            command = [sys.executable, "-m", "stand_in"]
        else:
            command = [sys.executable, "-c", script]
        path = os.pathsep.join([folder, *sys.path])
        done = subprocess.run(command, capture_output=True, text=True, timeout=60,
                              env={**os.environ, "PYTHONPATH": path})
    return done.returncode, done.stderr


def test_an_interrupt_while_the_command_says_it_stopped_still_exits_130():
    # a second Ctrl-C that lands after main caught the first (here: raised out of main);
    # without the entry point's catch Python ends the process by SIGINT (status -2)
    code, err = _run_the_command_with("""
        import os, signal, time
        def main():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the default handler raises here
            return 0
    """)
    assert code == 130, err


def test_a_ctrl_c_once_the_command_has_finished_leaves_its_status_alone():
    # main returned 3; a Ctrl-C in the exit's cleanup (a thread still being joined, as an
    # OpenEnv app's server is) is ignored: no traceback, the status main chose
    code, err = _run_the_command_with("""
        import os, signal, threading, time
        def main():
            def late():
                time.sleep(0.5)  # main has returned by now
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.5)  # the interpreter waits for this thread meanwhile
            threading.Thread(target=late).start()
            return 3
    """)
    assert code == 3, err
    assert "KeyboardInterrupt" not in err, err


def test_an_interrupt_caught_after_it_left_code_run_from_source_text_exits_130():
    # the Ctrl-C landed while Python ran code it had made from source text (a dataclass's
    # methods, a chat template) and main caught it: under python -m, CPython would end the
    # process by SIGINT (status -2) after main said "interrupted"; the entry point clears
    # that note (posttrain.cli.forget_uncaught_interrupt)
    code, err = _run_the_command_with("""
        import sys
        def main():
            try:
                exec("raise KeyboardInterrupt")
            except KeyboardInterrupt:
                print("posttrain eval: interrupted", file=sys.stderr)
                return 130
    """, as_module=True)
    assert code == 130, err
