"""The job's rendezvous store: ``python -m ddpjob_worker.rdzv --port P`` serves a c10d TCPStore forever, so no
worker pod hosts it and losing any worker never takes the store down (pytorch#67742)."""

from __future__ import annotations

import argparse
import os
import signal
import threading
import time
from collections.abc import Sequence
from datetime import timedelta

from ddpjob_worker.logs import get_logger

log = get_logger("rdzv")


def serve(host: str, port: int, stop: threading.Event, ready: threading.Event | None = None) -> None:
    """Serve the store until ``stop`` is set. ``wait_for_workers=False``: agents come and go; the store never
    waits for a fixed number of them."""
    from torch._C._distributed_c10d import TCPStore

    store = TCPStore(host, port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30),
                     use_libuv=os.environ.get("DDPJOB_RDZV_LIBUV", "1") == "1")
    log.info("rendezvous store listening on %s:%d", host, store.port)
    if ready is not None:
        ready.set()
    started = time.monotonic()
    while not stop.wait(600):
        log.info("rendezvous store up for %.0f min", (time.monotonic() - started) / 60)
    log.info("rendezvous store stopping")
    del store


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry for the rendezvous pod."""
    parser = argparse.ArgumentParser(prog="python -m ddpjob_worker.rdzv", description=__doc__)
    parser.add_argument("--port", type=int, required=True, help="TCP port of the store (spec.rendezvous.port)")
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default: all)")
    args = parser.parse_args(argv)
    stop = threading.Event()
    # SIGTERM (pod deletion) and SIGINT end the process with 0: stopping the store is the expected way out.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: stop.set())
    serve(args.host, args.port, stop)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
