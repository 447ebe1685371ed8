"""One thread for all torch work of the engine.

Runs keep their own worker threads for ordering, but hand every computation to this
single thread and wait for it. Two reasons, both measured on the 2-core test machine:

- torch's CPU kernels parallelise with OpenMP, and OpenMP keeps a separate thread team
  per calling thread. With one worker thread per run computing directly, 8 runs meant 8
  teams spinning for the same 2 cores.
- Two computations at once on a few cores only slow each other down; one at a time gives
  each the whole machine and makes timings repeatable.

With the machine shared by other jobs, a 2-thread OpenMP team can stall at every barrier
(one of its threads descheduled): we saw an 8-token sample take 33 s instead of 0.1 s. The
``threads`` argument (``posttrain serve --torch-threads``) sets torch's intra-op threads;
1 is the robust choice on a busy small machine, more pays off on an idle large one.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")


class ComputeThread:
    """Executes submitted callables one at a time, in submission order, on one thread."""

    def __init__(self, threads: int | None = None, name: str = "compute"):
        self._threads = threads
        self._jobs: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def run(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Call ``function(*args, **kwargs)`` on the compute thread and return its result
        (or raise its exception). Called from the compute thread itself, it runs inline."""
        if threading.current_thread() is self._thread:
            return function(*args, **kwargs)
        future: Future = Future()
        self._jobs.put((future, function, args, kwargs))
        return future.result()

    def stop(self) -> None:
        """Finish the queued work, then stop the thread."""
        self._jobs.put(None)
        self._thread.join(timeout=60)

    def _work(self) -> None:
        if self._threads is not None:
            import torch

            torch.set_num_threads(self._threads)
        while True:
            job = self._jobs.get()
            if job is None:
                return
            future, function, args, kwargs = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(function(*args, **kwargs))
            except BaseException as error:  # handed to the caller, who re-raises it
                future.set_exception(error)
