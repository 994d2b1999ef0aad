"""The rendezvous store (``python -m ddpjob_worker.rdzv``, pure-Python server by default) driven by torch's own
TCPStore clients, libuv and classic, of whatever torch runs the tests: every operation, waits released and timed
out, many clients at once, a client killed mid-wait, torchrun's c10d rendezvous backend; and the server process
itself (no torch imported, SIGTERM). DDPJOB_RDZV_IMPL=torch runs the same tests against torch's server."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from ddpjob_worker import procs
from ddpjob_worker.storeclient import CounterClient
from torch.distributed import TCPStore  # type: ignore[attr-defined]  # public, re-exported from torch._C

from tests.cluster.controlplane import free_port

pytestmark = pytest.mark.torchrun

TIMEOUT = timedelta(seconds=20)
SCRIPTS = Path(__file__).parent / "scripts"


class Server:
    """``python -m ddpjob_worker.rdzv`` on a free port, stopped with SIGTERM."""

    def __init__(self, log: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.log = log
        with open(log, "wb") as f:
            self.proc = subprocess.Popen(
                [sys.executable, *args, "-m", "ddpjob_worker.rdzv", "--host", "127.0.0.1", "--port", str(self.port)],
                stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        procs.wait_for_port(self.port, 60, self.proc)

    def client(self, libuv: bool = True, timeout: timedelta = TIMEOUT) -> Any:
        """A torch client; typed Any: torch's stubs lack half of TCPStore's methods."""
        return TCPStore("127.0.0.1", self.port, is_master=False, timeout=timeout, use_libuv=libuv)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    s = Server(tmp_path / "rdzv.log")
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(params=[True, False], ids=["libuv", "classic"])
def libuv(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


def needs(name: str) -> None:
    if not hasattr(TCPStore, name):
        pytest.skip(f"TCPStore.{name} is not in this torch")


def test_every_key_value_operation(server: Server, libuv: bool) -> None:
    a, b = server.client(libuv), server.client(libuv)
    a.set("k", "v")
    assert b.get("k") == b"v" and b.check(["k"]) and not b.check(["k", "missing"])
    assert a.add("n", 5) == 5 and b.add("n", -2) == 3 and a.get("n") == b"3"
    assert a.compare_set("cs", "", "first") == b"first"  # missing key, empty expectation: created
    assert a.compare_set("cs", "wrong", "second") == b"first"
    assert b.compare_set("cs", "first", "second") == b"second" and a.get("cs") == b"second"
    assert a.compare_set("absent", "x", "y") == b"x" and not a.check(["absent"])
    a.append("ap", "x")
    b.append("ap", "yz")
    assert a.get("ap") == b"xyz"
    a.multi_set(["m1", "m2"], ["1", b"\x00\xff"])
    assert b.multi_get(["m1", "m2", "k"]) == [b"1", b"\x00\xff", b"v"]
    assert a.num_keys() == 6
    assert a.delete_key("k") and not a.delete_key("k") and not b.check(["k"])
    assert a.num_keys() == 5
    big = os.urandom(1 << 20)
    a.set("big", big)
    assert b.get("big") == big
    if hasattr(TCPStore, "list_keys"):
        assert sorted(a.list_keys()) == ["ap", "big", "cs", "m1", "m2", "n"]


def test_a_wait_times_out_and_the_connection_stays_usable(server: Server, libuv: bool) -> None:
    c = server.client(libuv)
    started = time.monotonic()
    with pytest.raises(Exception, match=r"(?i)timeout"):
        c.wait(["never"], timedelta(seconds=0.5))
    assert 0.4 < time.monotonic() - started < 5
    c.set_timeout(timedelta(seconds=0.3))
    with pytest.raises(Exception, match=r"(?i)timeout"):
        c.get("never-either")  # a get is a wait first
    c.set_timeout(TIMEOUT)
    c.set("after", "1")  # CANCEL_WAIT was answered in step: the replies that follow are the right ones
    assert c.get("after") == b"1" and c.add("count", 1) == 1


def test_a_wait_is_released_by_another_clients_set(server: Server, libuv: bool) -> None:
    waiter, setter = server.client(libuv), server.client(libuv)
    got: list[bytes] = []
    thread = threading.Thread(target=lambda: got.append(waiter.get("late")))  # get = wait, then get
    thread.start()
    time.sleep(0.5)
    assert got == [] and thread.is_alive()
    setter.set("late", "here")
    thread.join(10)
    assert got == [b"here"]
    both = threading.Thread(target=waiter.wait, args=(["x", "y"],))
    both.start()
    setter.set("x", "1")
    time.sleep(0.3)
    assert both.is_alive(), "a wait on two keys returned after one"
    setter.add("y", 1)
    both.join(10)
    assert not both.is_alive()


def test_many_clients_at_once(server: Server) -> None:
    """64 torch clients connected and waiting on the same keys at once, released together by the last one's set.
    They run in a child process (scripts/many_store_clients.py), connecting in waves of 16 with one constructor at a
    time: TCPStore's constructor in several threads at once can abort the process when a store is freed (pybind11's
    race, pytorch#143593); a crash is this test's failure with the child's output and the server's state."""
    count = 64
    child = subprocess.run([sys.executable, str(SCRIPTS / "many_store_clients.py"), str(server.port), str(count), "16"],
                           capture_output=True, text=True, timeout=240, check=False)
    said = f"exit {child.returncode}\n{child.stdout[-3000:]}\n{child.stderr[-3000:]}"
    assert child.returncode == 0, said
    assert server.proc.poll() is None, f"the store died: {server.log.read_text()[-2000:]}"
    assert server.client().get("arrived") == str(count).encode(), said


def test_a_client_killed_mid_wait_does_not_hurt_the_others(server: Server) -> None:
    script = (f"from datetime import timedelta; from torch.distributed import TCPStore; "
              f"s = TCPStore('127.0.0.1', {server.port}, is_master=False, timeout=timedelta(seconds=60)); "
              f"s.set('waiting', '1'); s.wait(['never'])")
    victim = subprocess.Popen([sys.executable, "-c", script])
    try:
        c = server.client()
        c.wait(["waiting"])
        time.sleep(0.3)
    finally:
        victim.kill()
        victim.wait(10)
    c.set("never", "now")  # wakes nobody alive: the dead client's wait is gone
    assert c.get("never") == b"now" and server.proc.poll() is None


def test_queues(server: Server) -> None:
    needs("queue_push")
    a, b = server.client(), server.client()
    assert a.queue_len("q") == 0
    a.queue_push("q", "1")
    a.queue_push("q", b"2")
    assert b.queue_len("q") == 2 and b.queue_pop("q") == b"1" and b.queue_pop("q", block=False) == b"2"
    with pytest.raises(Exception, match=r"(?i)empty"):
        b.queue_pop("q", block=False)
    got: list[bytes] = []
    thread = threading.Thread(target=lambda: got.append(b.queue_pop("q")))
    thread.start()
    time.sleep(0.3)
    a.queue_push("q", "3")
    thread.join(10)
    assert got == [b"3"]


def test_barrier(server: Server) -> None:
    needs("barrier")
    clients = [server.client() for _ in range(3)]
    done: list[int] = []
    def arrive(i: int) -> None:
        clients[i].barrier("b", 3, TIMEOUT)
        done.append(i)

    threads = [threading.Thread(target=arrive, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    assert done == []
    clients[2].barrier("b", 3, TIMEOUT)
    for t in threads:
        t.join(10)
    assert sorted(done) == [0, 1]
    with pytest.raises(Exception, match=r"(?i)timeout"):
        clients[0].barrier("lonely", 2, timedelta(seconds=0.3))


def test_torchruns_c10d_rendezvous_backend(server: Server) -> None:
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import create_backend

    params = RendezvousParameters(backend="c10d", endpoint=f"127.0.0.1:{server.port}", run_id="job", min_nodes=1,
                                  max_nodes=2, is_host="false", read_timeout="10")
    backend, _store = create_backend(params)
    other, _ = create_backend(params)
    assert backend.get_state() is None
    written = backend.set_state(b"state-1")
    assert written is not None and written[0] == b"state-1" and written[2]
    assert other.get_state() == (b"state-1", written[1])
    stale = other.set_state(b"stale", None)
    assert stale is not None and stale[0] == b"state-1" and not stale[2], "a write with an old token must lose"


def test_the_default_server_imports_no_torch_and_stops_on_sigterm(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DDPJOB_RDZV_IMPL"}
    default = Server(tmp_path / "python.log", "-X", "importtime", env=env)
    try:
        added = default.client().add("n", 1)
    finally:
        stopped = default.stop()
    assert added == 1 and stopped == 0
    torch_one = Server(tmp_path / "torch.log", "-X", "importtime", env={**env, "DDPJOB_RDZV_IMPL": "torch"})
    assert torch_one.stop() == 0
    imported = {p: set(re.findall(r"\|\s+(\S+)$", p.read_text(), re.M)) for p in (default.log, torch_one.log)}
    assert "ddpjob_worker.storeserver" in imported[default.log] and "torch" not in imported[default.log]
    assert "torch" in imported[torch_one.log], "the check would not see torch being imported"
    assert "rendezvous store stopping" in default.log.read_text()


def test_the_peer_watchs_client_counts_with_torchs_clients(server: Server, libuv: bool) -> None:
    """ddpjob_worker.storeclient speaks torch's bytes: its counters are torch's counters, both ways."""
    torch_client, ours = server.client(libuv), CounterClient("127.0.0.1", server.port, 2)
    try:
        assert ours.add("ddpjob.peers/r/0/1", 1) == 1 and torch_client.add("ddpjob.peers/r/0/1", 2) == 3
        assert ours.add("ddpjob.peers/r/0/1", 0) == 3 and ours.add("ddpjob.peers/r/0/2", 0) == 0
    finally:
        ours.close()


def test_the_peer_watchs_client_on_torchs_own_server(libuv: bool) -> None:
    master = TCPStore("127.0.0.1", 0, is_master=True, timeout=TIMEOUT, use_libuv=libuv, wait_for_workers=False)
    ours = CounterClient("127.0.0.1", master.port, 2)
    try:
        assert ours.add("k", 4) == 4 and master.add("k", 1) == 5 and ours.add("k", 0) == 5
    finally:
        ours.close()


def test_a_frozen_store_costs_the_peer_watchs_client_its_timeout_not_more(server: Server) -> None:
    """The store process stopped (as on a powered-off node: the connection stays open, nothing answers). torch's
    own client waits in such an ``add`` until the kernel drops the connection; the watch's gives up in time."""
    ours = CounterClient("127.0.0.1", server.port, 1)
    assert ours.add("k", 1) == 1
    server.proc.send_signal(signal.SIGSTOP)
    try:
        wait_stopped(server.proc.pid)  # else the server may still answer the first call (issue 43 #17)
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            ours.add("k", 1)
        with pytest.raises(TimeoutError):
            CounterClient("127.0.0.1", server.port, 1)  # the kernel accepts; the PING is never answered
        # Two 1 s timeouts; torch's own client would wait until the kernel drops the connection (minutes).
        assert time.monotonic() - started < 6
    finally:
        server.proc.send_signal(signal.SIGCONT)
        ours.close()


def wait_stopped(pid: int, timeout: float = 10) -> None:
    """Until every thread of ``pid`` is stopped (state T in /proc/<pid>/task/*/stat): SIGSTOP returns before the
    kernel has stopped them, and a thread that still runs may answer one more request."""
    deadline = time.monotonic() + timeout
    while True:
        states = set()
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
                states.add(Path(task, "stat").read_text().rsplit(")", 1)[1].split()[0])
        if states <= {"T", "t"}:
            return
        assert time.monotonic() < deadline, f"process {pid} not stopped after {timeout} s: thread states {states}"
        time.sleep(0.01)
