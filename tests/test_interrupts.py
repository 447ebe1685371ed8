"""SIGTERM and an inherited, ignored SIGINT both reach a recipe as an interrupt."""

import os
import signal
import time

import pytest

from posttrain.interrupts import Terminated, interruptible, stop_reason


def test_sigterm_inside_raises_terminated_and_the_old_handler_comes_back():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated) as caught, interruptible():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises before this returns; if not, the test fails
    assert stop_reason(caught.value) == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before


def test_ctrl_c_works_even_when_the_process_started_with_sigint_ignored():
    saved = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with pytest.raises(KeyboardInterrupt) as caught, interruptible():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the handler raises before this returns; if not, the test fails
        assert stop_reason(caught.value) == "Ctrl-C"
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # put back as it was
    finally:
        signal.signal(signal.SIGINT, saved)
