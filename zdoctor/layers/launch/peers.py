"""Whether this node's TCP connections reach a peer's port, told apart as the kernel reports them, and
whether this node's own name resolves to an address a peer can reach.

``tcp_reach("10.0.0.2", 22)`` -> ``{"state": "refused", ...}``: ``connected`` (something listens),
``refused`` (the peer answered with a reset: nothing listens on the port), ``timed out`` (no answer: a
firewall drops the packets, or the host is down), ``reset`` (it accepted, then reset the connection),
``unreachable`` (a route or the neighbour lookup says the host cannot be reached), ``error`` (anything
else, with the errno's words).
"""

from __future__ import annotations

import concurrent.futures
import errno
import ipaddress
import socket
import threading
import time
from typing import Any

from zdoctor.layers.launch.hostcheck import resolve_all

#: Seconds one connection attempt may take.
CONNECT_TIMEOUT = 3.0
#: Seconds to wait for an ssh server's greeting after connecting.
BANNER_TIMEOUT = 2.0
PARALLEL = 16
_UNREACHABLE = {errno.EHOSTUNREACH: "unreachable", errno.ENETUNREACH: "unreachable",
                errno.ECONNREFUSED: "refused", errno.ECONNRESET: "reset", errno.ETIMEDOUT: "timed out"}


def _state(exc: OSError) -> str:
    if isinstance(exc, socket.timeout):
        return "timed out"
    return _UNREACHABLE.get(exc.errno or 0, "error")


def tcp_reach(address: str, port: int, *, timeout: float = CONNECT_TIMEOUT, banner: bool = False) -> dict[str, Any]:
    """One bounded TCP connect to ``address``:``port`` (``banner``: then read the server's first line, as an
    ssh server sends one): ``{address, port, state, error, seconds, banner}``."""
    rec: dict[str, Any] = {"address": address, "port": port, "state": "error", "error": None, "seconds": None,
                           "banner": None}
    t0 = time.monotonic()
    try:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            try:
                s.connect((address, port))
            except OSError as exc:
                rec.update(state=_state(exc), error=exc.strerror or str(exc) or "timed out")
                return rec
            rec["state"] = "connected"
            if banner:
                s.settimeout(BANNER_TIMEOUT)
                try:
                    first = s.recv(256)
                except socket.timeout:
                    rec["banner"] = ""
                except OSError as exc:
                    rec.update(state=_state(exc) if exc.errno == errno.ECONNRESET else "connected",
                               error=exc.strerror or str(exc))
                else:
                    rec["banner"] = first.split(b"\n", 1)[0].decode("ascii", "replace").strip()
                    if not first:
                        rec["error"] = "the server closed the connection without a greeting"
            return rec
    except (OSError, ValueError, OverflowError) as exc:
        rec["error"] = str(exc)
        return rec
    finally:
        rec["seconds"] = round(time.monotonic() - t0, 3)


def reach_all(targets: list[tuple[str, int, bool]], *, timeout: float = CONNECT_TIMEOUT) -> list[dict[str, Any]]:
    """:func:`tcp_reach` for each ``(address, port, banner)``, concurrently; in the order given."""
    if not targets:
        return []
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(PARALLEL, len(targets))) as pool:
        return list(pool.map(lambda t: tcp_reach(t[0], t[1], timeout=timeout, banner=t[2]), targets))


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def route_source(peer: str) -> str | None:
    """The address this node sends from towards ``peer`` (the kernel's route choice; no packet is sent)."""
    try:
        family = socket.AF_INET6 if ":" in peer else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((peer, 9))
            return str(s.getsockname()[0])
    except (OSError, ValueError):
        return None


def _fqdn(timeout: float = 5.0) -> str | None:
    """``socket.getfqdn()`` in a daemon thread (a reverse lookup can hang on a slow resolver)."""
    found: list[str] = []
    t = threading.Thread(target=lambda: found.append(socket.getfqdn()), daemon=True, name="zdoctor-fqdn")
    t.start()
    t.join(timeout)
    return found[0] if found else None


def own_name() -> dict[str, Any]:
    """This node's name (``hostname``) and fully qualified name (what torchrun's rendezvous advertises), the
    addresses each resolves to here (bounded lookups), and whether they are all loopback (127.x, ::1)."""
    out: dict[str, Any] = {"hostname": socket.gethostname(), "fqdn": _fqdn(), "names": []}
    for r in resolve_all(list(dict.fromkeys(n for n in (out["hostname"], out["fqdn"]) if n))):
        out["names"].append({"name": r["host"], "addresses": r["addresses"], "error": r["error"],
                             "loopback_only": bool(r["addresses"]) and all(is_loopback(a) for a in r["addresses"])})
    return out
