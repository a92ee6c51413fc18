"""Captures asked for on the control channel: torch.profiler around exactly the requested steps.

The collector library's listener thread reads the daemon's requests and answers ACCEPTED; the
training loop checks for accepted requests once per step (one native call) and runs them here,
between steps, never waiting for Kafka. A capture starts the profiler when the next step begins
and stops it when the requested number of steps has ended; its operator events are then handed
to the collector, which sends them in batches of their own tagged with the request id, followed
by the DONE reply. Anything that goes wrong answers FAILED with the reason, and training goes on.

torch's objects (the profiler, its events) are typed Any: torch is imported only when a capture
runs.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from rankwatch import _native  # noqa: F401  (the native module must load first)

if TYPE_CHECKING:
    from rankwatch._native import ControlRequest, KernelEvent


def _torch_profiler() -> tuple[Any, Any, Any, Any, Any] | None:
    """(torch, profile, ProfilerActivity, ProfilerAction, DeviceType), or None without torch."""
    try:
        import torch
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerAction, ProfilerActivity, profile
        return torch, profile, ProfilerActivity, ProfilerAction, DeviceType
    except Exception:  # noqa: BLE001 - any import failure means "no profiler here"
        return None


class _Capture:
    """One running capture: the profiler, the steps it has seen, its wall time."""

    def __init__(self, request: ControlRequest, prof: Any, device_type: Any, first_step: int,
                 t0: int) -> None:
        self.request = request
        self.prof = prof
        self.device_type = device_type
        self.first_step = first_step
        self.steps = 0
        self.t0 = t0


class CaptureRunner:
    """Runs the control requests of one collector, one at a time, at step boundaries."""

    def __init__(self, native: _native.Collector) -> None:
        self._native = native
        self._queue: list[ControlRequest] = []  # accepted requests not started yet
        self._running: _Capture | None = None   # the _Capture in progress

    @property
    def busy(self) -> bool:
        """A capture runs or waits for its first step."""
        return self._running is not None or bool(self._queue)

    def before_step(self, step: int) -> None:
        """At the beginning of step `step`: takes new requests, starts a capture if one waits."""
        if self._native.control_pending():
            self._queue.extend(self._native.take_control_requests())
        if self._running is not None or not self._queue:
            return
        request = self._queue.pop(0)
        if time.time_ns() > request["deadline_unix_ns"]:
            self._reply(request, "failed", "expired before a step began")
            return
        if request["action"] != "capture":
            self._reply(request, "refused", "unsupported: " + str(request["action"]))
            return
        found = _torch_profiler()
        if found is None:
            self._reply(request, "refused", "no_profiler: torch.profiler is not importable")
            return
        torch, profile, activity, action, device_type = found
        activities = [activity.CPU]
        if request.get("cuda") and torch.cuda.is_available():
            activities.append(activity.CUDA)
        try:
            # A schedule that records every step: only with a schedule does the profiler mark
            # each step with a "ProfilerStep#k" range (prof.step() between steps).
            prof = profile(activities=activities, schedule=lambda _: action.RECORD)
            prof.start()
        except Exception as e:  # noqa: BLE001 - reported, training goes on
            self._reply(request, "failed", "the profiler did not start: %s" % e)
            return
        self._running = _Capture(request, prof, device_type, first_step=step, t0=_native.now_ns())

    def after_step(self) -> None:
        """At the end of a step: counts it; stops and ships the capture after its last step."""
        cap = self._running
        if cap is None:
            return
        cap.steps += 1
        if cap.steps < cap.request["steps"]:
            try:
                cap.prof.step()  # closes ProfilerStep#k, opens #k+1
            except Exception as e:  # noqa: BLE001
                self._fail(cap, "the profiler failed: %s" % e)
            return
        self._running = None
        profiled_ns = _native.now_ns() - cap.t0
        try:
            cap.prof.stop()
            events = self._events(cap)
        except Exception as e:  # noqa: BLE001
            self._fail(cap, "the profiler failed: %s" % e, profiled_ns)
            return
        self._native.send_capture(cap.request["id"], "torch.profiler", events, cap.first_step,
                                  cap.steps, profiled_ns)

    def close(self) -> None:
        """Ends a capture that is still running (the job ends first): FAILED, not silent."""
        cap, self._running = self._running, None
        if cap is not None:
            self._fail(cap, "training ended after %d of %d steps" % (cap.steps, cap.request["steps"]))
        for request in self._queue:
            self._reply(request, "failed", "training ended before the capture began")
        self._queue = []

    # --- helpers ------------------------------------------------------------------------------
    def _fail(self, cap: _Capture, reason: str, profiled_ns: int = 0) -> None:
        try:
            cap.prof.stop()
        except Exception:  # noqa: BLE001 - already failing
            pass
        self._native.reply_control(cap.request["id"], "failed", reason, cap.first_step, cap.steps,
                                   profiled_ns)

    def _reply(self, request: ControlRequest, state: str, reason: str) -> None:
        self._native.reply_control(request["id"], state, reason, -1, 0, 0)

    def _events(self, cap: _Capture) -> list[KernelEvent]:
        """The profiled operators as (name, category, ts_ns, dur_ns, stream, correlation, step, tid)
        tuples. Steps come from the profiler's own "ProfilerStep#k" ranges, one a step, taken in
        time order (events() renames them all "ProfilerStep*", and torch 1.13 numbers the first
        two both #0): an event belongs to the step whose range holds its start."""
        events = list(cap.prof.events())
        marks = sorted((e.time_range.start, e.time_range.end) for e in events
                       if e.name.startswith("ProfilerStep"))
        ranges = [(lo, hi, cap.first_step + k) for k, (lo, hi) in enumerate(marks)]
        cuda = cap.device_type.CUDA
        out: list[KernelEvent] = []
        for e in events:
            if e.name.startswith("ProfilerStep"):
                continue
            start = e.time_range.start
            step = -1
            for lo, hi, s in ranges:
                if lo <= start < hi:
                    step = s
                    break
            if step < 0:
                continue  # outside the profiled steps (the profiler's own start and stop)
            on_device = e.device_type == cuda
            out.append((e.name, "kernel" if on_device else "cpu_op", int(start * 1000),
                        int(e.time_range.elapsed_us() * 1000), int(e.device_index) if on_device else -1,
                        -1, step, int(e.thread)))
        return out
