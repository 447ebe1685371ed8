"""One event loop, owned by one thread, for the ecosystem libraries' async scorers.

verifiers' rubrics and inspect_ai's scorers are coroutines; posttrain scores replies from
plain functions (``Env.score``), sometimes while an event loop already runs in the
calling thread (the service, a notebook), where ``asyncio.run`` refuses. So every
coroutine goes to one loop that lives in a daemon thread for the whole process: started
on first use, never one loop per reply (a loop per call also breaks clients that cache
a connection pool bound to the loop that made them).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    """A daemon thread running one event loop; ``run(coroutine)`` waits for its result."""

    def __init__(self, name: str = "posttrain-ecosystem-loop") -> None:
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def _started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def serve() -> None:
                    asyncio.set_event_loop(loop)
                    ready.set()
                    loop.run_forever()

                threading.Thread(target=serve, name=self._name, daemon=True).start()
                ready.wait()
                self._loop = loop
            return self._loop

    def run(self, coroutine: Awaitable[T], timeout: float | None = None) -> T:
        """The coroutine's result (its exception re-raised here), run on the shared loop."""
        loop = self._started()
        future = asyncio.run_coroutine_threadsafe(_awaited(coroutine), loop)
        return future.result(timeout)


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


#: the process's loop for ecosystem coroutines (a module-level object on purpose: one
#: loop per process is the point; it starts nothing until first used)
SHARED_LOOP = LoopThread()


def run_sync(coroutine: Awaitable[T], timeout: float | None = None) -> T:
    """Run ``coroutine`` on the process's ecosystem loop and return its result."""
    return SHARED_LOOP.run(coroutine, timeout)
