"""An emulated asynchronous device, for testing device time without a GPU.

A Device has streams; each stream is a thread executing the work queued to it, in order, while
the host goes on, on a device clock of its own: launch() queues a kernel (its device time: a
GPU kernel's duration does not depend on how busy the host's CPUs are; the thread sleeps until
it ends), Event.record() queues a time stamp of the stream's time when it reaches it, Stream.wait_event() makes a stream wait for an event recorded on another,
and Device.synchronize() makes the host wait for every stream, as `loss.item()` does on a GPU.
So host time and device time differ as they do on a GPU: a forward pass returns as soon as its
kernels are queued, and the host catches up at the next synchronisation.

Events have torch.cuda.Event's interface (record() on the current stream, query(),
elapsed_time(end) in milliseconds, synchronize()), so Device.clock() plugs into rankwatch's
device timing (rankwatch.device_clock.DeviceClock) as torch.cuda.Event does.

Times are time.monotonic_ns(), the clock of rankwatch's now_ns()."""
from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from rankwatch.device_clock import DeviceClock


class Stream:
    """An in-order queue of device work executed by a thread of its own, on a device clock of
    its own: a kernel starts when the one before it ended or when it was queued, whichever is
    later, and ends its duration after; an event is stamped with the stream's time when it is
    reached. The thread sleeps until a kernel's end, but a late wake-up (the host's CPUs or the
    GIL busy) delays only when the host learns of it, never the device's times: as on a GPU,
    device time does not depend on how busy the host is."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._work: queue.SimpleQueue[tuple[Callable[[int], None], int] | None] = queue.SimpleQueue()
        self.error: BaseException | None = None
        self.now_ns = 0  # the stream's device time: when its last work ended
        self._thread = threading.Thread(target=self._run, name="device-" + name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            fn, queued_ns = item
            self.now_ns = max(self.now_ns, queued_ns)
            try:
                fn(queued_ns)
            except BaseException as e:  # noqa: B036 -- kept for the host to raise at synchronize()
                self.error = e

    def _put(self, fn: Callable[[int], None]) -> None:
        self._work.put((fn, time.monotonic_ns()))

    def kernel(self, ms: float) -> None:
        """Queues a kernel of `ms` milliseconds of device time."""
        def run(queued_ns: int) -> None:
            self.now_ns += int(ms * 1e6)
            left = self.now_ns - time.monotonic_ns()
            if left > 0:
                time.sleep(left / 1e9)
        self._put(run)

    def submit(self, fn: Callable[[], Any]) -> None:
        """Queues `fn` (a collective, say) to run on the device after everything queued before
        it: it starts at the stream's time (the thread waits for it) and takes as long as it
        really takes."""
        def run(queued_ns: int) -> None:
            left = self.now_ns - time.monotonic_ns()
            if left > 0:
                time.sleep(left / 1e9)
            fn()
            self.now_ns = max(self.now_ns, time.monotonic_ns())
        self._put(run)

    def stamp(self, event: Event, done: threading.Event) -> None:
        def run(queued_ns: int) -> None:
            event._ns = self.now_ns
            done.set()
        self._put(run)

    def wait_event(self, event: Event) -> None:
        """Work queued after this waits until `event` (as last recorded) has completed."""
        done = event._done

        def run(queued_ns: int) -> None:
            done.wait()
            self.now_ns = max(self.now_ns, event._ns)
        self._put(run)

    def close(self) -> None:
        self._work.put(None)
        self._thread.join(timeout=10)


class Event:
    """A timing event: stamped with its stream's device time when the stream reaches it."""

    def __init__(self, device: Device) -> None:
        self._device = device
        self._done = threading.Event()
        self._ns = 0

    def record(self, stream: Stream | None = None) -> None:
        stream = stream or self._device.current_stream()
        done = self._done = threading.Event()
        stream.stamp(self, done)

    def query(self) -> bool:
        return self._done.is_set()

    def synchronize(self) -> None:
        self._done.wait()

    def elapsed_time(self, end: Event) -> float:
        if not (self._done.is_set() and end._done.is_set()):
            raise RuntimeError("elapsed_time of an event that has not completed")
        return (end._ns - self._ns) / 1e6


class Device:
    """A compute stream (the default current stream) and a communication stream."""

    def __init__(self) -> None:
        self.compute = Stream("compute")
        self.comm = Stream("comm")
        self._local = threading.local()

    def current_stream(self) -> Stream:
        return getattr(self._local, "stream", None) or self.compute

    @contextlib.contextmanager
    def stream(self, stream: Stream) -> Iterator[Stream]:
        """Makes `stream` the calling thread's current stream, as torch.cuda.stream does."""
        before = getattr(self._local, "stream", None)
        self._local.stream = stream
        try:
            yield stream
        finally:
            self._local.stream = before

    def launch(self, ms: float, stream: Stream | None = None) -> None:
        """Queues a kernel of `ms` milliseconds of device time on `stream` (default: current)."""
        (stream or self.current_stream()).kernel(ms)

    def new_event(self) -> Event:
        return Event(self)

    def clock(self) -> DeviceClock:
        return DeviceClock(self.new_event, "emulated")

    def synchronize(self) -> None:
        """The host waits until every stream has run everything queued so far."""
        for s in (self.compute, self.comm):
            ev = Event(self)
            ev.record(s)
            ev.synchronize()
            if s.error is not None:
                raise RuntimeError("device stream %s failed" % s.name) from s.error

    def close(self) -> None:
        self.synchronize()
        self.compute.close()
        self.comm.close()
