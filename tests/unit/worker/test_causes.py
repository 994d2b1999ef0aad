"""causes.condense and causes.is_peer_loss over real failure texts (captured from torch 2.15 with gloo on CPU
unless noted)."""

from __future__ import annotations

import json

import pytest
from ddpjob_worker import causes

# What the survivor of a 2-rank gloo job raised when the other rank was SIGKILLed inside all_reduce
# (tests/unit/worker: captured with torch 2.15, the worker's stderr under torchrun's rank prefix).
GLOO_PEER_KILLED = """\
[rank0]: Traceback (most recent call last):
[rank0]:   File "/tmp/peer/peer.py", line 14, in <module>
[rank0]:     main()
[rank0]:   File "/work/main/.venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/errors/\
__init__.py", line 384, in wrapper
[rank0]:     result = f(*args, **kwargs)
[rank0]:              ^^^^^^^^^^^^^^^^^^
[rank0]:   File "/tmp/peer/peer.py", line 13, in main
[rank0]:     dist.all_reduce(t)
[rank0]:   File "/work/main/.venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 4181, \
in all_reduce
[rank0]:     work.wait()
[rank0]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection closed by \
peer [127.0.0.1]:48281. This is typically caused by a remote worker crashing. Check the logs of the remote worker \
before reporting an error. GLHF! \U0001f3d6\ufe0f
"""
GLOO_PEER_KILLED_LINE = (
    "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection closed by peer "
    "[127.0.0.1]:48281. This is typically caused by a remote worker crashing. Check the logs of the remote worker "
    "before reporting an error. GLHF! \U0001f3d6\ufe0f"
)

# The same failure as the survivor's torchelastic error file (@record, i.e. ddpjob_worker.recorded).
GLOO_PEER_KILLED_ERROR_FILE = json.dumps({"message": {
    "message": GLOO_PEER_KILLED_LINE,
    "extraInfo": {
        "py_callstack": "Traceback (most recent call last):\n  File \"/tmp/peer/peer.py\", line 13, in main\n"
                        "    dist.all_reduce(t)\n  File \"/work/main/.venv/lib/python3.11/site-packages/torch/"
                        "distributed/distributed_c10d.py\", line 4181, in all_reduce\n    work.wait()\n"
                        f"{GLOO_PEER_KILLED_LINE}\n",
        "timestamp": "1795469741",
    },
}})

# The store's host (rank 0) was SIGKILLed while rank 1 waited in store.get(), TORCH_SHOW_CPP_STACKTRACES=1.
C10D_STORE_LOST_ERROR_FILE_MESSAGE = """\
DistNetworkError: Failed to recv, got 0 bytes. Connection was likely closed. Did the remote server shutdown or crash?
Exception raised from recvBytes at /__w/pytorch/pytorch/torch/csrc/distributed/c10d/Utils.hpp:786 (most recent call \
first):
C++ CapturedTraceback:
#4 ?? from /work/main/.venv/lib/python3.11/site-packages/torch/lib/libc10.so:714418
#5 c10::Error::Error(c10::SourceLocation, std::__cxx11::basic_string<char, std::char_traits<char>, \
std::allocator<char> >) from /work/main/.venv/lib/python3.11/site-packages/torch/lib/libc10.so:708924
#10 c10d::TCPStore::doWait(c10::ArrayRef<std::__cxx11::basic_string<char, std::char_traits<char>, \
std::allocator<char> > >, std::chrono::duration<long, std::ratio<1l, 1000l> >) from /work/main/.venv/lib/python3.11/\
site-packages/torch/lib/libtorch_cpu.so:110894212
#29 _start from /root/.pyenv/versions/3.11.7/bin/python3.11:4224
"""

# Older torch (2.1-2.3) native frames, as in many bug reports.
C10D_OLD_FRAMES = """\
Traceback (most recent call last):
  File "/app/train.py", line 40, in <module>
    dist.barrier()
torch.distributed.DistBackendError: [1] is setting up NCCL communicator and retrieving ncclUniqueId from [0] via \
c10d key-value store by key '0', but store->get('0') got error: Connection reset by peer
Exception raised from recvBytes at ../torch/csrc/distributed/c10d/Utils.hpp:670 (most recent call first):
frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x57 (0x7f1c3b37a617 in /opt/venv/lib/python3.10/\
site-packages/torch/lib/libc10.so)
frame #1: c10::detail::torchCheckFail(char const*, char const*, unsigned int, char const*) + 0x68 (0x7f1c3b335a98 \
in /opt/venv/lib/python3.10/site-packages/torch/lib/libc10.so)
frame #2: c10d::TCPStore::doWait(c10::ArrayRef<std::string>, std::chrono::duration<long, std::ratio<1l, 1000l> >) \
+ 0x299 (0x7f1c2a0e4d39 in /opt/venv/lib/python3.10/site-packages/torch/lib/libtorch_cpu.so)
"""

# torchrun's own argparse failure (captured: `python -m torch.distributed.run --nnodes 2 --bogus x.py`).
TORCHRUN_USAGE = """\
usage: run.py [-h] [--nnodes NNODES] [--nproc-per-node NPROC_PER_NODE]
              [--rdzv-backend RDZV_BACKEND] [--rdzv-endpoint RDZV_ENDPOINT]
              [--shutdown-timeout SHUTDOWN_TIMEOUT] [--virtual-local-rank]
              training_script ...
run.py: error: unrecognized arguments: --bogus
"""

# A hung peer: rank 1 never called all_reduce, rank 0's gloo collective timed out (timeout=3 s).
GLOO_TIMEOUT = """\
[rank0]:   File "/work/main/.venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 4181, \
in all_reduce
[rank0]:     work.wait()
[rank0]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out \
waiting 3000ms for recv operation to complete
"""

# NCCL (from a GPU job's log, torch 2.4): a multi-line message.
NCCL_REMOTE = """\
Traceback (most recent call last):
  File "train.py", line 88, in step
    dist.all_reduce(loss)
torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, remote process \
exited or there was a network error, NCCL version 2.20.5
ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.
Last error:
socketProgress: Connection closed by remote peer 10.0.3.7<51234>
"""

USER_BUG_CHAINED = """\
Traceback (most recent call last):
  File "train.py", line 10, in load
    return json.loads(text)
json.decoder.JSONDecodeError: Expecting value: line 1 column 1 (char 0)

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "train.py", line 20, in <module>
    cfg = load(path)
  File "train.py", line 12, in load
    raise ConfigError(f"bad config {path}") from err
ConfigError: bad config /etc/train.json
"""

# The checkpoint library's own exception type (no Error suffix), chained, in an error file's callstack.
CORRUPT_CHECKPOINT = json.dumps({"message": {"message": "CorruptCheckpoint: cannot load state.pt", "extraInfo": {
    "py_callstack": """\
Traceback (most recent call last):
  File "/app/ddpjob_worker/storage.py", line 240, in read
    data = torch.load(path)
FileNotFoundError: [Errno 2] No such file or directory: '/checkpoints/step-2/state.pt'

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/app/ddpjob_worker/storage.py", line 247, in read
    raise CorruptCheckpoint(f"cannot load {PAYLOAD}: {err}") from err
ddpjob_worker.storage.CorruptCheckpoint: cannot load state.pt
""", "timestamp": "1"}}})

OOM = "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total capacity)"
# Source lines of a traceback are searched by neither function: this one merely quotes the words.
QUOTING_SOURCE = """\
Traceback (most recent call last):
  File "train.py", line 3, in <module>
    raise ValueError("Connection closed by peer")  if False else int("x")
ValueError: invalid literal for int() with base 10: 'x'
"""


@pytest.mark.parametrize(("text", "line"), [
    (GLOO_PEER_KILLED, GLOO_PEER_KILLED_LINE),
    (GLOO_PEER_KILLED_ERROR_FILE, GLOO_PEER_KILLED_LINE),
    (C10D_STORE_LOST_ERROR_FILE_MESSAGE, "DistNetworkError: Failed to recv, got 0 bytes. Connection was likely "
                                         "closed. Did the remote server shutdown or crash?"),
    (json.dumps({"message": C10D_STORE_LOST_ERROR_FILE_MESSAGE, "timestamp": 1}),
     "DistNetworkError: Failed to recv, got 0 bytes. Connection was likely closed. Did the remote server shutdown "
     "or crash?"),
    (C10D_OLD_FRAMES, "DistBackendError: [1] is setting up NCCL communicator and retrieving ncclUniqueId from [0] "
                      "via c10d key-value store by key '0', but store->get('0') got error: Connection reset by peer"),
    (TORCHRUN_USAGE, "run.py: error: unrecognized arguments: --bogus"),
    (GLOO_TIMEOUT, "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] "
                   "Timed out waiting 3000ms for recv operation to complete"),
    (NCCL_REMOTE, "DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, remote "
                  "process exited or there was a network error, NCCL version 2.20.5 ncclRemoteError: A call failed "
                  "possibly due to a network error or a remote process exiting prematurely. Last error: "
                  "socketProgress: Connection closed by remote peer 10.0.3.7<51234>"),
    (USER_BUG_CHAINED, "ConfigError: bad config /etc/train.json (caused by JSONDecodeError: Expecting value: "
                       "line 1 column 1 (char 0))"),
    (CORRUPT_CHECKPOINT, "CorruptCheckpoint: cannot load state.pt (caused by FileNotFoundError: [Errno 2] No such "
                         "file or directory: '/checkpoints/step-2/state.pt')"),
    (OOM, OOM),
    (QUOTING_SOURCE, "ValueError: invalid literal for int() with base 10: 'x'"),
    ("Signal 9 (SIGKILL) received by PID 4242", "Signal 9 (SIGKILL) received by PID 4242"),
    ("", ""),
])
def test_condense_gives_the_exception_in_one_line(text: str, line: str) -> None:
    assert causes.condense(text) == line


@pytest.mark.parametrize("text", [GLOO_PEER_KILLED, C10D_STORE_LOST_ERROR_FILE_MESSAGE, C10D_OLD_FRAMES,
                                  TORCHRUN_USAGE, NCCL_REMOTE])
def test_condense_never_returns_frames_addresses_or_usage(text: str) -> None:
    line = causes.condense(text)
    assert "\n" not in line and "0x" not in line and "frame #" not in line and " from /" not in line
    assert "usage:" not in line and "Exception raised from" not in line


def test_condense_caps_the_length() -> None:
    line = causes.condense("ValueError: " + "x" * 1000, limit=80)
    assert len(line) == 80 and line.startswith("ValueError: xxx") and line.endswith("...")


@pytest.mark.parametrize(("text", "peer"), [
    (GLOO_PEER_KILLED, True),
    (GLOO_PEER_KILLED_ERROR_FILE, True),
    (C10D_STORE_LOST_ERROR_FILE_MESSAGE, True),
    (C10D_OLD_FRAMES, True),
    (GLOO_TIMEOUT, True),
    (NCCL_REMOTE, True),
    ("torch.distributed.DistBackendError: [Rank 1] Watchdog caught collective operation timeout: "
     "WorkNCCL(SeqNum=42, OpType=ALLREDUCE) ran for 600018 milliseconds before timing out.", True),
    ("RuntimeError: Socket Timeout", True),
    ("DistBackendError: NCCL error: invalid usage (run with NCCL_DEBUG=WARN for details)", False),
    (USER_BUG_CHAINED, False),
    (OOM, False),
    (QUOTING_SOURCE, False),
    (TORCHRUN_USAGE, False),
    ("Signal 9 (SIGKILL) received by PID 4242", False),
    ("", False),
])
def test_is_peer_loss(text: str, peer: bool) -> None:
    assert causes.is_peer_loss(text) is peer


def test_causes_does_not_import_torch() -> None:
    """The operator imports causes; its image has no torch."""
    import subprocess
    import sys

    code = "import sys, ddpjob_worker.causes; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
