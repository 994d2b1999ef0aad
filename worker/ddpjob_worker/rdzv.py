"""The job's rendezvous store: ``python -m ddpjob_worker.rdzv --port P`` serves a c10d TCPStore forever, so no
worker pod hosts it and losing any worker never takes the store down (pytorch#67742). The default server is the
pure-Python one (ddpjob_worker.storeserver): the rendezvous pod needs no torch; ``--impl torch`` (or
DDPJOB_RDZV_IMPL=torch) serves torch's own C++ server instead, for comparison."""

from __future__ import annotations

import argparse
import os
import signal
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Protocol

from ddpjob_worker.logs import get_logger

log = get_logger("rdzv")

#: Which server ``python -m ddpjob_worker.rdzv`` runs when ``--impl`` is not given: ``python`` or ``torch``.
DDPJOB_RDZV_IMPL = "DDPJOB_RDZV_IMPL"
#: With the torch server: ``1`` (default) for its libuv backend, ``0`` for the classic one.
DDPJOB_RDZV_LIBUV = "DDPJOB_RDZV_LIBUV"
IMPLS = ("python", "torch")
#: How often serve() wakes to notice a stop (a signal's handler), and how often it logs the store's size.
WAKE_SECONDS = 0.5
LOG_EVERY_SECONDS = 600


class RunningStore(Protocol):
    """A store being served, whichever implementation serves it."""

    port: int

    def describe(self) -> str: ...

    def close(self) -> None: ...


class _TorchStore:
    """Torch's C++ server; imported only when chosen, so the default path never loads torch."""

    def __init__(self, host: str, port: int) -> None:
        from torch.distributed import TCPStore  # type: ignore[attr-defined]  # public: torch re-exports it

        # wait_for_workers=False: agents come and go; the store never waits for a fixed number of them. Torch's
        # server ignores ``host``: it listens on all addresses.
        self._store = TCPStore(host, port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30),
                               use_libuv=os.environ.get(DDPJOB_RDZV_LIBUV, "1") == "1")
        self.port = int(self._store.port)

    def describe(self) -> str:
        return f"{self._store.num_keys()} keys"

    def close(self) -> None:
        del self._store


def start_store(impl: str, host: str, port: int) -> RunningStore:
    """Start serving with ``impl``; the port accepts connections when this returns."""
    if impl == "torch":
        return _TorchStore(host, port)
    from ddpjob_worker.storeserver import StoreServer

    return StoreServer(host, port).start()


def serve(host: str, port: int, stop: threading.Event, ready: threading.Event | None = None,
          impl: str = "python") -> None:
    """Serve the store until ``stop`` is set."""
    store = start_store(impl, host, port)
    log.info("rendezvous store (%s server) listening on %s:%d", impl, host, store.port)
    if ready is not None:
        ready.set()
    started = logged = time.monotonic()
    # Short waits: the kernel may hand SIGTERM to any thread (the server's, or torch's), and Python runs the handler
    # that sets ``stop`` only when this thread wakes; one 600 s wait ignored a pod's deletion until SIGKILL.
    while not stop.wait(WAKE_SECONDS):
        if time.monotonic() - logged >= LOG_EVERY_SECONDS:
            logged = time.monotonic()
            log.info("rendezvous store up for %.0f min: %s", (logged - started) / 60, store.describe())
    log.info("rendezvous store stopping")
    store.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry for the rendezvous pod."""
    parser = argparse.ArgumentParser(prog="python -m ddpjob_worker.rdzv", description=__doc__)
    parser.add_argument("--port", type=int, required=True, help="TCP port of the store (spec.rendezvous.port)")
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default: all)")
    parser.add_argument("--impl", choices=IMPLS, default=os.environ.get(DDPJOB_RDZV_IMPL, "python"),
                        help=f"store server: python (default; no torch needed) or torch (env {DDPJOB_RDZV_IMPL})")
    args = parser.parse_args(argv)
    if args.impl not in IMPLS:  # a default from the environment skips argparse's choices check
        parser.error(f"{DDPJOB_RDZV_IMPL}={args.impl!r}: expected one of {', '.join(IMPLS)}")
    stop = threading.Event()
    # SIGTERM (pod deletion) and SIGINT end the process with 0: stopping the store is the expected way out.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: stop.set())
    serve(args.host, args.port, stop, impl=args.impl)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
