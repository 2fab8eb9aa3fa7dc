"""Training batches, built ahead by a background thread: :class:`Prefetcher` computes
``make(start), make(start + 1), ...`` in a daemon thread, and :class:`StepBatches` hands the
training loop a step's batch (and the next step's) from it, between steps.

The batches come in that order whatever the depth, so prefetching changes when a batch is built,
never which batch comes. The data path goes one way: the thread builds, the loop takes ready
batches and passes them to the executor; nothing downstream calls back into the iterator. The
worker thread holds no reference to the iterator, so an iterator that is dropped without
:meth:`Prefetcher.close` is still collected, and its thread stops at its next hand-over.
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

_POLL_S = 0.1  # how often a blocked worker checks whether it should stop


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


def _shut(stop: threading.Event, out: queue.Queue, thread: threading.Thread) -> None:
    stop.set()
    try:  # unblock a worker waiting on a full queue
        while True:
            out.get_nowait()
    except queue.Empty:
        pass
    if thread is not threading.current_thread():
        thread.join(timeout=10 * _POLL_S)


class Prefetcher(Iterator[Any]):
    """Endless iterator over ``make(start), make(start + 1), ...``, built by a daemon thread up
    to ``depth`` (>= 1) batches ahead of the consumer.

    The thread starts at the first ``next``; :meth:`skip` before that moves past a batch without
    building it, so a consumer that only skips builds nothing. An exception in ``make`` is raised
    by the ``next`` call that would have returned that batch, and the iterator ends.
    """

    def __init__(self, make: Callable[[int], Any], start: int = 0, depth: int = 2,
                 name: str = "skyjax-data-prefetch"):
        if depth < 1:
            raise ValueError(f"prefetch depth={depth!r} must be >= 1")
        self._make = make
        self._next = start
        self._depth = int(depth)
        self._name = name
        self._done = False
        self._stop = threading.Event()
        self._queue: queue.Queue = queue.Queue(maxsize=self._depth)
        self._thread: threading.Thread | None = None
        self._finalizer: Callable[[], Any] | None = None

    def _start(self) -> None:
        self._thread = threading.Thread(target=_work, name=self._name, daemon=True,
                                        args=(self._make, self._next, self._queue, self._stop))
        self._thread.start()
        self._finalizer = weakref.finalize(self, _shut, self._stop, self._queue, self._thread)

    def __iter__(self) -> Prefetcher:
        return self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        if self._thread is None:
            self._start()
        while True:
            try:
                kind, value = self._queue.get(timeout=_POLL_S)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    self._done = True
                    raise StopIteration from None
        if kind == "error":
            self.close()
            raise value
        self._next += 1
        return value

    def skip(self) -> None:
        """Moves past the next batch: unbuilt while the thread has not started, else taken from
        the thread's queue (it builds in order)."""
        if self._thread is not None:
            next(self)
        elif not self._done:
            self._next += 1

    def close(self) -> None:
        """Stops the worker thread; later ``next`` calls raise StopIteration."""
        self._done = True
        if self._finalizer is not None:
            self._finalizer()

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class StepBatches:
    """The training loop's side of a :class:`Prefetcher` whose batch ``i`` is step ``start + i``'s:
    per step, :meth:`take` gives the step's batch and the next step's, both already built by the
    thread, for ``executor.train_step`` (a pipeline stage puts the next step's inputs on its
    device while it waits during this step: ``DistributedExecutor.train_step``). Steps are taken
    in order, one :meth:`take` each."""

    def __init__(self, batches: Prefetcher, start: int = 0):
        self.batches = batches
        self._step = start  # the step of the iterator's next batch
        # ("ok", batch) or ("error", exception) of the next step, taken by the last take
        self._held: tuple[str, Any] | None = None

    def take(self, step: int, read: bool = True, ahead: bool = True) -> tuple[Any, Any]:
        """``(step's batch, step + 1's batch)``; the second is None where not ``ahead`` (the last
        step). Where not ``read`` (the executor's stage reads no batch): ``(None, None)``, the
        step's batch skipped, unbuilt where the thread has not started. A batch that failed to
        build is raised by the ``take`` of its own step."""
        held, self._held = self._held, None
        expected = self._step - 1 if held is not None else self._step
        if step != expected:
            raise ValueError(f"step {step} taken where step {expected} comes next")
        if held is not None:
            kind, batch = held
            if kind == "error":
                raise batch
        else:
            self._step += 1
            if not read:
                self.batches.skip()
                return None, None
            batch = next(self.batches)
        if not read:
            return None, None
        following = None
        if ahead:
            self._step += 1
            try:
                following = next(self.batches)
                self._held = ("ok", following)
            except Exception as e:  # noqa: BLE001 - raised by the next take
                self._held = ("error", e)
        return batch, following

    def close(self) -> None:
        """Stops the prefetch thread."""
        self.batches.close()
