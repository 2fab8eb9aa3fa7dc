"""Processes as threads over one ``LocalTransport``: what the multi-process tests run in one."""

from __future__ import annotations

import threading
from typing import Any, Callable


def run_as_processes(fn: Callable[[int], Any], n: int, transport: Any,
                     timeout_s: float = 300.0) -> list:
    """``[fn(0), ..., fn(n - 1)]``, each in its own thread; the first error aborts
    ``transport`` (so that the others do not wait for their timeout) and is raised."""
    results: list = [None] * n
    errors: list[BaseException] = []

    def one(k: int) -> None:
        try:
            results[k] = fn(k)
        except BaseException as e:  # noqa: BLE001 - handed to the test below
            errors.append(e)
            transport.abort(e)

    threads = [threading.Thread(target=one, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    if errors:
        raise errors[0]
    assert not any(t.is_alive() for t in threads), f"threads still running after {timeout_s} s"
    return results
