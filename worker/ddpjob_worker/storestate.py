"""The rendezvous store's state, apart from its wire protocol (storeserver.py): keys, queues, counters and the
clients waiting for keys, with torch's TCPStore semantics. No I/O: the server's event loop is its only caller."""

from __future__ import annotations

import re
import struct
from collections import deque
from collections.abc import Callable, Iterable

STOP_WAITING = b"\x00"
#: Torch's libuv server refuses a larger value; an APPEND may not build one either.
MAX_VALUE_LEN = 8 * 1024 * 1024
#: What the store holds at most: keys and queued items (entries), and their bytes. torchrun's c10d rendezvous writes
#: 2 keys per agent and round (its role and its ranks, ~180 bytes with their names) and the peer watch 1 more, so
#: 4 Mi entries hold 100 rounds of 10,000 agents. At ~180 bytes of memory each, the rendezvous pod's default memory
#: limit (256 MiB) binds first, after ~1.4 M entries (the store restarts empty and the agents carry on): these caps
#: bound a store whose pod has a higher limit or none.
MAX_ENTRIES = 4 * 1024 * 1024
MAX_STORED_BYTES = 1024**3
_U64 = struct.Struct("<Q")
#: What std::stoll accepts at the start of a stored counter; anything after the digits is ignored, as there.
_INT = re.compile(rb"\s*[+-]?\d+")


class ProtocolError(Exception):
    """The peer broke the protocol; its connection is closed, as torch's servers close it."""


class StoreFull(ProtocolError):
    """A write would take the store past MAX_ENTRIES or MAX_STORED_BYTES: the writer's connection is closed and
    nothing of the request is stored."""


class Waiter:
    """A connection's pending WAIT or BARRIER: the keys it still misses, and how to tell its client."""

    __slots__ = ("missing", "notify")

    def __init__(self, notify: Callable[[bytes], None]) -> None:
        self.missing: set[bytes] = set()
        self.notify = notify


def parse_counter(value: bytes) -> int:
    """The integer an ADD or BARRIER finds stored under its key."""
    match = _INT.match(value)
    if match is None:
        raise ProtocolError(f"stored value {value[:32]!r} is not an integer")
    return int(match.group(0))


def blob(data: bytes) -> bytes:
    """A value as replies carry it: u64 length, bytes."""
    return _U64.pack(len(data)) + data


class KeyValueState:
    """The store's keys, queues and waiters. Only the event loop's thread touches it (torch's servers are single
    threaded too), so it needs no locks and every operation is atomic."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}
        self.queues: dict[bytes, deque[bytes]] = {}
        #: Keys and queued items, and their bytes (keys counted once per key or queue), against the caps.
        self.entries = 0
        self.stored_bytes = 0
        # key -> the waiters missing it, oldest first (a dict as an ordered set: O(1) removal on cancel).
        self._waiting: dict[bytes, dict[Waiter, None]] = {}

    def set(self, key: bytes, value: bytes) -> None:
        self._put(key, value)
        self._wake(key)

    def set_many(self, pairs: list[tuple[bytes, bytes]]) -> None:
        """MULTI_SET: all pairs or, past a cap, none; no waiter ever sees half of them. A key given twice is
        written once, with its last value (what the client reads after either way)."""
        final = dict(pairs)
        self._check(*self._growth(final.items()))
        for key, value in final.items():
            self.set(key, value)

    def get(self, key: bytes) -> bytes:
        # Empty for a key deleted between the client's WAIT and its GET, as torch's libuv server answers.
        return self.data.get(key, b"")

    def add(self, key: bytes, delta: int) -> int:
        total = delta + (parse_counter(self.data[key]) if key in self.data else 0)
        if not -(2**63) <= total < 2**63:
            raise ProtocolError(f"add overflows int64 on key {key[:64]!r}")
        self.set(key, str(total).encode())
        return total

    def compare_set(self, key: bytes, expected: bytes, desired: bytes) -> bytes:
        current = self.data.get(key)
        if current is None:
            if expected:
                return expected  # torch's answer for a missing key with a non-empty expectation
            self.set(key, desired)
            return desired
        if current == expected:
            self.set(key, desired)
            return desired
        return current

    def exists(self, key: bytes) -> bool:
        """Set, or a non-empty queue: a blocking queue_pop waits on the queue's name."""
        return key in self.data or bool(self.queues.get(key))

    def check(self, keys: list[bytes]) -> bool:
        return all(self.exists(k) for k in keys)

    def wait(self, keys: list[bytes], waiter: Waiter) -> bool:
        """True when all ``keys`` exist now; otherwise ``waiter`` is notified once they do. A connection has one
        pending wait: a torch client never sends another before the answer or its CANCEL_WAIT."""
        self.cancel(waiter)
        missing = {k for k in keys if not self.exists(k)}
        if not missing:
            return True
        self._register(waiter, missing)
        return False

    def cancel(self, waiter: Waiter) -> None:
        """Forget ``waiter`` (CANCEL_WAIT, or its connection closed)."""
        for key in waiter.missing:
            waiters = self._waiting.get(key, {})
            waiters.pop(waiter, None)
            if not waiters:
                self._waiting.pop(key, None)
        waiter.missing = set()

    def delete(self, key: bytes) -> int:
        old = self.data.pop(key, None)
        if old is None:
            return 0
        self._release(1, len(key) + len(old))
        return 1

    def append(self, key: bytes, value: bytes) -> None:
        old = self.data.get(key, b"")
        if len(old) + len(value) > MAX_VALUE_LEN:
            raise ProtocolError(f"append to key {key[:64]!r} would make its value larger than {MAX_VALUE_LEN} bytes")
        self.set(key, old + value)

    def queue_push(self, key: bytes, value: bytes) -> None:
        self._reserve(1, len(value) + (0 if key in self.queues else len(key)))
        self.queues.setdefault(key, deque()).append(value)
        # One item releases one waiter, the oldest: each blocking queue_pop is there for one item.
        waiters = self._waiting.get(key)
        if waiters:
            waiter = next(iter(waiters))
            del waiters[waiter]
            if not waiters:
                del self._waiting[key]
            waiter.missing.discard(key)
            if not waiter.missing:
                waiter.notify(STOP_WAITING)

    def queue_pop(self, key: bytes) -> tuple[int, bytes | None]:
        """The queue's length before the pop, and the item popped (None when it was empty)."""
        queue = self.queues.get(key)
        if not queue:
            return 0, None
        length, item = len(queue), queue.popleft()
        self._release(1, len(item))
        if not queue:
            del self.queues[key]  # an empty queue answers like a missing one; keeping it would only cost memory
            self._release(0, len(key))
        return length, item

    def queue_len(self, key: bytes) -> int:
        return len(self.queues.get(key, ()))

    def barrier(self, key: bytes, world_size: int, waiter: Waiter) -> bool:
        """Count one arrival at ``key``; True when it completes the barrier, otherwise ``waiter`` is notified when
        a later arrival does. Arrivals do not wake waiters; only the completing one does, as in torch."""
        count = (parse_counter(self.data[key]) if key in self.data else 0) + 1
        self._put(key, str(count).encode())
        if count >= world_size:
            self._wake(key)
            return True
        self.cancel(waiter)
        self._register(waiter, {key})
        return False

    def _growth(self, pairs: Iterable[tuple[bytes, bytes]]) -> tuple[int, int]:
        """The entries and bytes that writing ``pairs`` (distinct keys) would add."""
        pairs = list(pairs)
        entries = sum(key not in self.data for key, _ in pairs)
        size = sum(len(v) - len(self.data[k]) if k in self.data else len(k) + len(v) for k, v in pairs)
        return entries, size

    def _check(self, entries: int, size: int) -> None:
        if self.entries + entries > MAX_ENTRIES:
            raise StoreFull(f"the store is full: {self.entries} keys and queued items (at most {MAX_ENTRIES})")
        if self.stored_bytes + size > MAX_STORED_BYTES:
            raise StoreFull(f"the store is full: {self.stored_bytes} bytes stored (at most {MAX_STORED_BYTES})")

    def _reserve(self, entries: int, size: int) -> None:
        self._check(entries, size)
        self.entries += entries
        self.stored_bytes += size

    def _release(self, entries: int, size: int) -> None:
        self.entries -= entries
        self.stored_bytes -= size

    def _put(self, key: bytes, value: bytes) -> None:
        self._reserve(*self._growth([(key, value)]))
        self.data[key] = value

    def _register(self, waiter: Waiter, missing: Iterable[bytes]) -> None:
        waiter.missing = set(missing)
        for key in waiter.missing:
            self._waiting.setdefault(key, {})[waiter] = None

    def _wake(self, key: bytes) -> None:
        for waiter in self._waiting.pop(key, {}):
            waiter.missing.discard(key)
            if not waiter.missing:
                waiter.notify(STOP_WAITING)
