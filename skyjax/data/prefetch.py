"""Host-side prefetch: a background thread computes batches ``make(i)`` ahead of the consumer.

The batches are ``make(start), make(start + 1), ...`` in that order whatever the depth, so
prefetching changes when a batch is built, never which batch comes. The worker thread holds no
reference to the iterator, so an iterator that is dropped without :meth:`Prefetcher.close` is
still collected, and its thread stops at its next hand-over.
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

_POLL_S = 0.1  # how often a blocked worker checks whether it should stop
_DONE = object()


def _work(make: Callable[[int], Any], start: int, out: queue.Queue, stop: threading.Event) -> None:
    index = start
    while not stop.is_set():
        try:
            item: Any = ("ok", make(index))
        except BaseException as e:  # handed to the consumer, raised there
            item = ("error", e)
        while not stop.is_set():
            try:
                out.put(item, timeout=_POLL_S)
                break
            except queue.Full:
                continue
        if item[0] == "error":
            return
        index += 1


def _shut(stop: threading.Event, out: queue.Queue, thread: threading.Thread | None) -> None:
    stop.set()
    try:  # unblock a worker waiting on a full queue
        while True:
            out.get_nowait()
    except queue.Empty:
        pass
    if thread is not None and thread is not threading.current_thread():
        thread.join(timeout=10 * _POLL_S)


class Prefetcher(Iterator[Any]):
    """Endless iterator over ``make(start), make(start + 1), ...``.

    ``depth`` > 0: a daemon thread builds up to ``depth`` batches ahead. ``depth`` = 0: each batch
    is built in the caller's thread when asked for. An exception in ``make`` is raised by the
    ``next`` call that would have returned that batch, and the iterator ends.
    """

    def __init__(self, make: Callable[[int], Any], start: int = 0, depth: int = 2,
                 name: str = "skyjax-data-prefetch"):
        self._make = make
        self._next = start
        self._done = False
        self._stop = threading.Event()
        self._queue: queue.Queue = queue.Queue(maxsize=max(depth, 1))
        self._thread = None
        self._peeked: tuple[str, Any] | None = None  # (kind, value) taken ahead by peek()
        if depth > 0:
            self._thread = threading.Thread(target=_work, name=name, daemon=True,
                                            args=(make, start, self._queue, self._stop))
            self._thread.start()
        self._finalizer = weakref.finalize(self, _shut, self._stop, self._queue, self._thread)

    def __iter__(self) -> Prefetcher:
        return self

    def __next__(self) -> Any:
        if self._peeked is not None:
            (kind, value), self._peeked = self._peeked, None
        else:
            kind, value = self._take()
        if kind == "error":
            self.close()
            raise value
        self._next += 1
        return value

    def _take(self) -> tuple[str, Any]:
        """The next ("ok", batch) or ("error", exception); StopIteration when done."""
        if self._done:
            raise StopIteration
        if self._thread is None:
            try:
                return "ok", self._make(self._next)
            except Exception as e:  # noqa: BLE001 - raised by the next ``next``
                return "error", e
        while True:
            try:
                return self._queue.get(timeout=_POLL_S)
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    self._done = True
                    raise StopIteration from None

    def peek(self) -> Any | None:
        """The batch the next ``next`` returns, built now if it is not yet (in the caller's
        thread when ``depth`` = 0), so that a caller can place that work where it costs nothing:
        a pipeline stage's wait for a message (``DistributedExecutor.train_step``'s
        ``upcoming``). None when the iterator has ended or that batch failed to build: the next
        ``next`` then raises, in the training loop rather than inside a pipeline step."""
        if self._peeked is None:
            try:
                self._peeked = self._take()
            except StopIteration:
                return None
        kind, value = self._peeked
        return value if kind == "ok" else None

    def skip(self) -> None:
        """Moves past the next batch without building it where that is possible (``depth`` =
        0): a process whose pipeline stage does not read the step's batch."""
        if self._peeked is not None or self._thread is not None:
            next(self)
        elif not self._done:
            self._next += 1

    def close(self) -> None:
        """Stops the worker thread; later ``next`` calls raise StopIteration."""
        self._done = True
        self._finalizer()

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
