"""Hang stacks: where every thread of this rank is, answered while the training thread is stuck.
(The same thread answers Flight Recorder dump requests: rankwatch/flight_recorder.py.)

When rankwatchd diagnoses a job as hung it asks every rank for its stacks on the control
channel (control.proto, StacksAction). The collector library's listener thread answers ACCEPTED
at once (which tells the daemon the process is alive) and hands the request to the responder
here: a Python thread of the collector's own ("rw:stacks") that waits for requests in native
code, without the GIL, so it costs the training thread nothing until a request comes. It then
takes every Python thread's frames (sys._current_frames: the training thread's too, wherever it
waits, as long as it gives the GIL up now and then, which blocking calls and the interpreter's
switch interval both do) and the collective counters, and answers DONE.

Collective counters, per process group of torch.distributed: `entered` is the group's sequence
number, the collectives this rank has issued on it (DDP's allreduces included); `completed` is
what it was when the rank's last step ended (a step ends after its collectives). A rank waiting
in a collective has entered more than it completed; a rank that never reached the collective the
others wait in has entered fewer than they have.
"""
from __future__ import annotations

import atexit
import sys
import threading
from types import FrameType
from typing import TYPE_CHECKING, Any

from rankwatch import _native  # noqa: F401  (the native module must load first)
from rankwatch import flight_recorder as _flight_recorder

if TYPE_CHECKING:
    from rankwatch._native import CollectiveCount, ControlRequest, StackFrame, ThreadStack
    from rankwatch.collector import Collector

_WAIT_MS = 1000


class CollectiveCounters:
    """The process groups' sequence numbers, now and at the end of the last step."""

    def __init__(self, native: _native.Collector) -> None:
        self._native = native
        self._c10d: Any = None  # torch.distributed.distributed_c10d, once initialised
        self._groups: list[tuple[str, int, Any, bool]] = []  # [(name, size, pg, is_default)]
        self._known = -1        # len(_pg_map) when _groups was built
        self.completed: dict[str, int] = {}  # group name -> entered at the last step end

    def _refresh(self) -> bool:
        """The process groups, once torch.distributed is initialised (cheap when unchanged)."""
        if self._c10d is None:
            dist = sys.modules.get("torch.distributed")
            if dist is None:
                return False
            try:
                if not dist.is_available() or not dist.is_initialized():
                    return False
            except Exception:  # noqa: BLE001 - an odd build: no counters
                return False
            self._c10d = dist.distributed_c10d
        pg_map = self._c10d._pg_map
        if len(pg_map) != self._known:
            default = self._c10d.GroupMember.WORLD
            groups = []
            for pg in list(pg_map):
                if not hasattr(pg, "_get_sequence_number_for_group"):
                    continue
                name = self._c10d._pg_names.get(pg, "")
                groups.append((name or "default", pg.size(), pg, pg is default))
            # The default group first: its count is the one each step carries.
            groups.sort(key=lambda g: not g[3])
            self._groups, self._known = groups, len(pg_map)
        return bool(self._groups)

    def at_step_end(self) -> None:
        """Training thread, after each step: the counts become the completed ones; the default
        group's rides with the step."""
        if not self._refresh():
            return
        completed: dict[str, int] = {}
        for name, _size, pg, is_default in self._groups:
            try:
                seq = pg._get_sequence_number_for_group()
            except Exception:  # noqa: BLE001 - a destroyed group
                continue
            completed[name] = seq
            if is_default:
                self._native.record_collectives(seq)
        self.completed = completed

    def now(self) -> list[CollectiveCount]:
        """[(group, size, entered, completed)] for a stacks answer (any thread)."""
        if not self._refresh():
            return []
        out: list[CollectiveCount] = []
        completed = self.completed
        for name, size, pg, _is_default in self._groups:
            try:
                entered = pg._get_sequence_number_for_group()
            except Exception:  # noqa: BLE001
                continue
            out.append((name, size, entered, completed.get(name, 0)))
        return out


def thread_stacks(max_frames: int, training_ident: int, skip_ident: int) -> list[ThreadStack]:
    """Every Python thread but `skip_ident` as (name, id, training, frames, omitted), frames
    outermost first as (file, line, function), at most `max_frames` innermost ones; the
    training thread first."""
    names = {t.ident: t.name for t in threading.enumerate()}
    out: list[ThreadStack] = []
    for ident, frame in sys._current_frames().items():
        if ident == skip_ident:
            continue
        frames: list[StackFrame] = []
        f: FrameType | None = frame
        total = 0
        while f is not None:
            if len(frames) < max_frames:
                code = f.f_code
                frames.append((code.co_filename, f.f_lineno or 0, code.co_name))
            total += 1
            f = f.f_back
        frames.reverse()
        out.append((names.get(ident, "thread-%d" % ident), ident, ident == training_ident, frames,
                    total - len(frames)))
    out.sort(key=lambda t: not t[2])
    return out


class StackResponder:
    """The "rw:stacks" thread: answers stacks requests until the collector closes."""

    def __init__(self, native: _native.Collector, collector: Collector) -> None:
        self._native = native
        self._collector = collector
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="rw:stacks", daemon=True)
        self._thread.start()
        # At interpreter exit the thread must be out of native code before finalization: a
        # daemon thread that takes the GIL back after it began is ended by the interpreter
        # (pthread_exit), which aborts the process when the unwinding crosses C++ frames.
        atexit.register(self.stop)

    def _run(self) -> None:
        while not self._stop:
            try:
                requests = self._native.wait_stack_requests(_WAIT_MS)
            except Exception:  # noqa: BLE001 - the collector is gone
                return
            for r in requests:
                self.answer(r)

    def answer(self, request: ControlRequest) -> None:
        """Answers one stacks request: DONE with the stacks and counters, or FAILED. A Flight
        Recorder request, which comes the same way, goes to rankwatch.flight_recorder."""
        c = self._collector
        if request["action"] == "flight_recorder":
            _flight_recorder.answer(self._native, request, c.rank)
            return
        try:
            threads = thread_stacks(int(request.get("max_frames", 64)), c._training_ident,
                                    threading.get_ident())
            collectives = c._collectives.now()
            self._native.reply_stacks(request["id"], threads, collectives, c._next_step - 1,
                                      c._in_step)
        except Exception as e:  # noqa: BLE001 - answered, never raised into the process
            self._native.reply_control(request["id"], "failed", "stacks: %s" % e)

    def stop(self) -> None:
        """Ends the thread and waits for it (at most 2 s). Idempotent; close() and exit call it."""
        self._stop = True
        try:
            self._native.wake_stack_waiters()
        except Exception:  # noqa: BLE001 - the collector is gone already
            pass
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(2.0)
        atexit.unregister(self.stop)
