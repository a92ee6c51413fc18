"""Flight Recorder dump requests: this rank's PyTorch Flight Recorder dump, written on demand.

When rankwatchd diagnoses a job as hung it asks every rank for its Flight Recorder dump on the
control channel (control.proto, FlightRecorderAction), so that the node agent watching the job's
dump path publishes it and the daemon can name the rank that holds the job across its process
groups. The request reaches the collector's "rw:stacks" thread (it must not wait for the training
thread, which is stuck), which answers here:

* torch exposes ``torch._C._distributed_c10d._dump_fr_trace`` (torch 2.x, every backend: gloo's
  collectives are recorded too when TORCH_FR_BUFFER_SIZE is set) or, in NCCL builds,
  ``_dump_nccl_trace``: its bytes (the pickle PyTorch's watchdog writes on a timeout) go to
  ``${TORCH_FR_DUMP_TEMP_FILE}${rank}`` (older torch: ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``;
  PyTorch's default prefix /tmp/nccl_trace_rank_), written under a temporary name and renamed,
  so the agent never reads half a dump; DONE.
* otherwise (a torch with neither, such as 1.x): REFUSED, reason "unsupported: ...".
* writing fails: FAILED with the error.
"""
from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from rankwatch import _native
    from rankwatch._native import ControlRequest

DEFAULT_PREFIX = "/tmp/nccl_trace_rank_"  # PyTorch's default dump prefix
# The dump prefix variables, PyTorch's current name first.
PREFIX_VARIABLES = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
# torch's dump functions, preferred first: every backend's recorder, then NCCL's.
DUMP_FUNCTIONS = ("_dump_fr_trace", "_dump_nccl_trace")


def dump_function() -> Callable[[], Any] | None:
    """torch's Flight Recorder dump (bytes of the pickle), or None where torch has none."""
    torch = sys.modules.get("torch")  # a job that never imported torch has no recorder
    if torch is None:
        return None
    c10d = getattr(getattr(torch, "_C", None), "_distributed_c10d", None)
    for name in DUMP_FUNCTIONS:
        fn = getattr(c10d, name, None)
        if callable(fn):
            found: Callable[[], Any] = fn
            return found
    return None


def dump_path(rank: int) -> str:
    """Where PyTorch writes rank `rank`'s dump: the job's dump prefix + rank."""
    for name in PREFIX_VARIABLES:
        prefix = os.environ.get(name)
        if prefix:
            return prefix + str(rank)
    return DEFAULT_PREFIX + str(rank)


def write_dump(data: bytes, path: str) -> None:
    """`data` to `path` through a temporary name in the same folder (atomic for a reader)."""
    tmp = "%s.rw-%d.tmp" % (path, os.getpid())
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def answer(native: _native.Collector, request: ControlRequest, rank: int) -> None:
    """Answers one Flight Recorder request for `rank`: DONE, REFUSED or FAILED (never raises)."""
    fn = dump_function()
    if fn is None:
        torch = sys.modules.get("torch")
        version = getattr(torch, "__version__", None) if torch is not None else None
        native.reply_control(request["id"], "refused",
                             "unsupported: %s has no Flight Recorder dump "
                             "(torch._C._distributed_c10d._dump_fr_trace)"
                             % ("torch " + str(version) if version else "this process"))
        return
    path = dump_path(rank)
    try:
        data = fn()
        if isinstance(data, str):
            data = data.encode()
        if not isinstance(data, (bytes, bytearray)):
            raise TypeError("the Flight Recorder dump is %s, not bytes" % type(data).__name__)
        write_dump(bytes(data), path)
    except Exception as e:  # noqa: BLE001 - answered, never raised into the process
        native.reply_control(request["id"], "failed", "flight recorder: %s" % e)
        return
    native.reply_control(request["id"], "done")
