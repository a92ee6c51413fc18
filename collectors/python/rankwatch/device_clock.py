"""Device time: phases and ops timed with events recorded on the streams their work runs on,
read back a step or more later without ever waiting for the device.

On a GPU, a host clock read around `model(x)` measures when the host *queued* the kernels; the
device runs them later, and the host catches up wherever it next synchronises (`loss.item()`,
a memory query, the next batch's copy). An event recorded on the stream at each boundary is
stamped when the device reaches it, so the time between two events is what the device did.
Recording an event costs a few microseconds; reading it (query(), then elapsed_time()) costs
nothing once it has completed, and DeviceTimer only reads events that have.

This module imports nothing but the standard library (torch only inside clock_for): it runs
where the collector's native module does not, e.g. a GPU machine that writes step records to
files (scripts/gpu/device_time_check.py).

Thread-safety: mark(), phase() and op() from any thread (the autograd engine's threads record
backward); end_step() and poll() from the training thread. The open step's entries are a list
appended under the GIL."""
from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

# A timing event with the interface of torch's (torch.cuda.Event(enable_timing=True),
# torch.Event): record() on the current stream, query() -> completed, elapsed_time(end) -> ms.
Event = Any


class DeviceClock:
    """Makes the timing events of one accelerator. `new_event()` returns an event with torch's
    interface: record() (on the calling thread's current stream), query() -> bool,
    elapsed_time(end_event) -> milliseconds (float). `name` says which device ("cuda",
    "xpu", "emulated", ...)."""

    def __init__(self, new_event: Callable[[], Event], name: str) -> None:
        self.new_event, self.name = new_event, name

    def __repr__(self) -> str:
        return "DeviceClock(%r)" % self.name


def clock_for(device: str) -> DeviceClock | None:
    """The device clock of `device` ("cuda:0", "xpu:1", ...), or None for the CPU, where host
    time is device time, and for a device whose events torch cannot time. CUDA (and ROCm, which
    torch calls cuda): torch.cuda.Event(enable_timing=True); another accelerator:
    torch.Event(device=..., enable_timing=True) where torch has it (2.4 and later)."""
    kind = device.split(":", 1)[0]
    if kind in ("", "cpu", "meta"):
        return None
    import torch
    if kind == "cuda":
        if not torch.cuda.is_available():
            return None
        cuda_event = torch.cuda.Event
        return DeviceClock(lambda: cuda_event(enable_timing=True), "cuda")
    generic: Any = getattr(torch, "Event", None)
    if generic is None:
        return None
    where = torch.device(device)
    try:
        generic(device=where, enable_timing=True)
    except (RuntimeError, TypeError, ValueError):  # a device without timing events
        return None
    return DeviceClock(lambda: generic(device=where, enable_timing=True), kind)


class DeviceStep(NamedTuple):
    """A step's device times, as Collector.set_device_times takes them: (phase, device ns) per
    phase, (op index, device begin ns, device end ns) per op on the host's monotonic clock, and
    whether the events did not complete in time (then both lists are empty)."""
    step: int
    phases: list[tuple[int, int]]
    ops: list[tuple[int, int, int]]
    missing: bool


# An entry of a step: (phase or -1, op index or -1, begin event, end event, host begin ns).
_Entry = tuple[int, int, Event, Event, int]


class _Pending:
    __slots__ = ("step", "entries", "checked")

    def __init__(self, step: int, entries: list[_Entry]) -> None:
        self.step, self.entries, self.checked = step, entries, 0

    def complete(self) -> bool:
        """Whether every event has completed; resumes where the last look stopped."""
        entries, i = self.entries, self.checked
        while i < len(entries):
            e = entries[i]
            if not (e[3].query() and e[2].query()):
                self.checked = i
                return False
            i += 1
        self.checked = i
        return True


def _ns(ms: float) -> int:
    return int(round(ms * 1e6))


class DeviceTimer:
    """Times phases and ops on the device: mark() records an event on the current stream;
    phase() and op() file a pair of events under the open step; end_step() closes it; poll()
    returns the steps whose events have all completed, oldest first, never waiting. A step
    still incomplete when more than `steps_in_flight` steps wait behind it is given up
    (DeviceStep.missing): its record goes with host times.

    Op times are placed on the host's monotonic clock: an event's device time is that of the
    step's first event (its anchor) plus the elapsed time between them, and the anchor's is the
    latest bound the step's events give (no event runs before the host queued it). That bound is
    exact when some event was recorded on an idle device (the usual first event of a step that
    follows a synchronisation) and otherwise early by the device's lag at best."""

    MAX_FREE_EVENTS = 4096

    def __init__(self, clock: DeviceClock, steps_in_flight: int = 8) -> None:
        if steps_in_flight < 1:
            raise ValueError("steps_in_flight must be at least 1, not %d" % steps_in_flight)
        self.clock, self.steps_in_flight = clock, steps_in_flight
        self._new_event = clock.new_event
        self._free: list[Event] = []
        self._open: list[_Entry] = []
        self._pending: deque[_Pending] = deque()
        self.steps_timed = 0    # resolved with device times
        self.steps_missing = 0  # given up
        self.events = 0         # events created (the rest are reused)

    def mark(self) -> Event:
        """Records a reusable event on the calling thread's current stream and returns it."""
        try:
            ev = self._free.pop()
        except IndexError:
            ev = self._new_event()
            self.events += 1
        ev.record()
        return ev

    def phase(self, phase: int, begin: Event, end: Event, host_begin_ns: int) -> None:
        """Files the device time from `begin` to `end` under `phase` of the open step."""
        self._open.append((phase, -1, begin, end, host_begin_ns))

    def op(self, index: int, begin: Event, end: Event, host_begin_ns: int) -> None:
        """Files op `index` of the open step (Collector.add_op's answer; -1: the op was dropped,
        its events are only released)."""
        self._open.append((-1, index, begin, end, host_begin_ns))

    def end_step(self, step: int) -> None:
        """Closes the open step: what is filed from now on belongs to the next one."""
        entries, self._open = self._open, []
        self._pending.append(_Pending(step, entries))

    @property
    def in_flight(self) -> int:
        """Closed steps whose device times have not been returned yet."""
        return len(self._pending)

    def poll(self) -> list[DeviceStep]:
        """The closed steps whose events have completed (and those given up), oldest first."""
        out: list[DeviceStep] = []
        pending = self._pending
        while pending:
            p = pending[0]
            if p.complete():
                pending.popleft()
                out.append(self._resolve(p))
            elif len(pending) > self.steps_in_flight:
                pending.popleft()  # its events are dropped, not reused: they may still run
                self.steps_missing += 1
                out.append(DeviceStep(p.step, [], [], True))
            else:
                break
        return out

    def drain(self) -> list[DeviceStep]:
        """At close: every closed step, those whose events have not completed as missing."""
        out = self.poll()
        while self._pending:
            p = self._pending.popleft()
            if p.complete():
                out.append(self._resolve(p))
            else:
                self.steps_missing += 1
                out.append(DeviceStep(p.step, [], [], True))
        return out

    def _resolve(self, p: _Pending) -> DeviceStep:
        self.steps_timed += 1
        phases: dict[int, int] = {}
        ops: list[tuple[int, int, int]] = []
        entries = p.entries
        anchor = entries[0][2] if entries else None
        anchor_ns = -(1 << 62)
        op_offsets: list[tuple[int, int, int]] = []
        for phase, index, e0, e1, h0 in entries:
            if phase >= 0:
                phases[phase] = phases.get(phase, 0) + max(0, _ns(e0.elapsed_time(e1)))
                anchor_ns = max(anchor_ns, h0 - _ns(anchor.elapsed_time(e0)))
            elif index >= 0:
                b = _ns(anchor.elapsed_time(e0))
                e = max(b, _ns(anchor.elapsed_time(e1)))
                anchor_ns = max(anchor_ns, h0 - b)
                op_offsets.append((index, b, e))
        if op_offsets:
            ops = [(index, anchor_ns + b, anchor_ns + e) for index, b, e in op_offsets]
        free = self._free
        if len(free) < self.MAX_FREE_EVENTS:  # an event may end two phases: reused once
            free.extend({id(ev): ev for entry in entries for ev in (entry[2], entry[3])}.values())
        return DeviceStep(p.step, sorted(phases.items()), ops, False)
