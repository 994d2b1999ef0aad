"""The rendezvous store's state, apart from its wire protocol (storeserver.py): keys, queues, counters and the
clients waiting for keys, with torch's TCPStore semantics. No I/O: the server's event loop is its only caller."""

from __future__ import annotations

import re
import struct
from collections import deque
from collections.abc import Callable, Iterable

STOP_WAITING = b"\x00"
_U64 = struct.Struct("<Q")
#: What std::stoll accepts at the start of a stored counter; anything after the digits is ignored, as there.
_INT = re.compile(rb"\s*[+-]?\d+")


class ProtocolError(Exception):
    """The peer broke the protocol; its connection is closed, as torch's servers close it."""


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
        # key -> the waiters missing it, oldest first (a dict as an ordered set: O(1) removal on cancel).
        self._waiting: dict[bytes, dict[Waiter, None]] = {}

    def set(self, key: bytes, value: bytes) -> None:
        self.data[key] = value
        self._wake(key)

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
        return 0 if self.data.pop(key, None) is None else 1

    def append(self, key: bytes, value: bytes) -> None:
        self.set(key, self.data.get(key, b"") + value)

    def queue_push(self, key: bytes, value: bytes) -> None:
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
        if not queue:
            del self.queues[key]  # an empty queue answers like a missing one; keeping it would only cost memory
        return length, item

    def queue_len(self, key: bytes) -> int:
        return len(self.queues.get(key, ()))

    def barrier(self, key: bytes, world_size: int, waiter: Waiter) -> bool:
        """Count one arrival at ``key``; True when it completes the barrier, otherwise ``waiter`` is notified when
        a later arrival does. Arrivals do not wake waiters; only the completing one does, as in torch."""
        count = (parse_counter(self.data[key]) if key in self.data else 0) + 1
        self.data[key] = str(count).encode()
        if count >= world_size:
            self._wake(key)
            return True
        self.cancel(waiter)
        self._register(waiter, {key})
        return False

    def _register(self, waiter: Waiter, missing: Iterable[bytes]) -> None:
        waiter.missing = set(missing)
        for key in waiter.missing:
            self._waiting.setdefault(key, {})[waiter] = None

    def _wake(self, key: bytes) -> None:
        for waiter in self._waiting.pop(key, {}):
            waiter.missing.discard(key)
            if not waiter.missing:
                waiter.notify(STOP_WAITING)
