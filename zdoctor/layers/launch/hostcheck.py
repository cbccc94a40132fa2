"""Whether each host of a hostfile resolves on this node (bounded, concurrent): the name lookup the launcher's
ssh or pdsh does first."""

from __future__ import annotations

import queue
import socket
import threading
import time
from typing import Any

#: Seconds all lookups together may take; a host still unanswered then is reported as timed out.
RESOLVE_TIMEOUT = 6.0
RESOLVE_WORKERS = 16


def _lookup(name: str) -> dict[str, Any]:
    t0 = time.monotonic()
    try:
        infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except socket.gaierror as exc:
        return {"host": name, "addresses": [], "error": exc.strerror or str(exc),
                "seconds": round(time.monotonic() - t0, 3)}
    except (OSError, UnicodeError) as exc:
        return {"host": name, "addresses": [], "error": str(exc), "seconds": round(time.monotonic() - t0, 3)}
    addrs = list(dict.fromkeys(str(i[4][0]) for i in infos))
    return {"host": name, "addresses": addrs, "error": None, "seconds": round(time.monotonic() - t0, 3)}


def resolve_all(names: list[str], timeout: float = RESOLVE_TIMEOUT) -> list[dict[str, Any]]:
    """``[{host, addresses, error, seconds}]`` in the order of ``names``. The lookups run in daemon threads
    (a hung resolver cannot hold zdoctor); those not done within ``timeout`` seconds say so."""
    todo: queue.Queue[str] = queue.Queue()
    for n in names:
        todo.put(n)
    done: dict[str, dict[str, Any]] = {}
    lock = threading.Lock()

    def work() -> None:
        while True:
            try:
                name = todo.get_nowait()
            except queue.Empty:
                return
            rec = _lookup(name)
            with lock:
                done[name] = rec

    threads = [threading.Thread(target=work, daemon=True, name="zdoctor-resolve")
               for _ in range(min(RESOLVE_WORKERS, len(names)))]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    with lock:
        return [done.get(n) or {"host": n, "addresses": [], "error": f"no answer within {timeout:g} s",
                                "seconds": None, "timed_out": True} for n in names]
