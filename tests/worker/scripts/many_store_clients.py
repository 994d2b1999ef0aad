"""Test script: COUNT torch TCPStore clients (libuv and classic alternately), one thread each, on the store at
127.0.0.1:PORT; each sets its key, adds to ``arrived``, waits for every client's key and reads its neighbour's.
Clients connect in waves of WAVE (a wave's threads start together, the next wave once they are in), so all COUNT
are connected and waiting together. The constructors themselves run one at a time: TCPStore's ``__init__`` releases
the GIL, and pybind11 registers instances made that way in several threads at once racily; the process then aborts
when one is freed ("pybind11_object_dealloc(): Tried to deallocate unregistered instance!", pytorch#143593,
pybind11#5473; seen in CI under torch 2.6.0 on 2026-12-06). That is the client library's bug, not the store's; the
store still sees COUNT connections held and COUNT waits at once. Exit 0 when all did; 1 with the errors otherwise.

    python many_store_clients.py PORT COUNT WAVE
"""

from __future__ import annotations

import sys
import threading
from datetime import timedelta

from torch.distributed import TCPStore  # type: ignore[attr-defined]  # public, re-exported from torch._C

TIMEOUT = timedelta(seconds=30)


def main(port: int, count: int, wave: int) -> int:
    errors: list[str] = []
    gates = [threading.Event() for _ in range(0, count, wave)]
    connected = threading.Semaphore(0)
    constructing = threading.Lock()  # pybind11#5473: never two TCPStore constructors at once

    def one(i: int) -> None:
        gates[i // wave].wait()
        try:
            with constructing:
                store = TCPStore("127.0.0.1", port, is_master=False, timeout=TIMEOUT, use_libuv=i % 2 == 0)
        except BaseException as e:  # counted as connected: the next wave must not wait for it
            errors.append(f"client {i} could not connect: {e!r}")
            return
        finally:
            connected.release()
        try:
            store.set(f"rank/{i}", str(i))
            store.add("arrived", 1)
            store.wait([f"rank/{j}" for j in range(count)])
            got = store.get(f"rank/{(i + 1) % count}")
            if got != str((i + 1) % count).encode():
                errors.append(f"client {i} read {got!r} for rank/{(i + 1) % count}")
        except BaseException as e:
            errors.append(f"client {i}: {e!r}")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for gate in gates:
        gate.set()
        for _ in range(wave):
            if not connected.acquire(timeout=60):
                errors.append("a wave did not connect within 60 s")
                break
    for t in threads:
        t.join(90)
    errors += [f"client thread {i} still running after 90 s" for i, t in enumerate(threads) if t.is_alive()]
    print("\n".join(errors[:10]) or f"{count} clients done", flush=True)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(*(int(a) for a in sys.argv[1:4])))
