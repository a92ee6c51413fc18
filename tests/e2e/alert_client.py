"""A WatchAlerts subscriber written with Debian's python3-grpcio and the stubs generated from
the project's protos, as an automation would write it: it keeps the last sequence it saw and
resumes after it whenever the stream breaks."""
import threading
import time

import grpc

from rankwatch.v1 import service_pb2, service_pb2_grpc


class Watcher:
    """Collects alerts in a background thread. `resume=False` stops at the first break."""

    def __init__(self, address, job="", after=0, resume=True, credentials=None, read_delay=0.0,
                 options=None):
        self.address = address
        self.job = job
        self.last = after
        self.resume = resume
        self.credentials = credentials
        self.read_delay = read_delay
        self.options = options or []
        self.alerts = []          # (alert, wall time received)
        self.breaks = []          # grpc status codes that ended a stream
        self._stop = threading.Event()
        self._call = None
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _channel(self):
        if self.credentials is not None:
            return grpc.secure_channel(self.address, self.credentials, options=self.options)
        return grpc.insecure_channel(self.address, options=self.options)

    def _run(self):
        while not self._stop.is_set():
            channel = self._channel()
            stub = service_pb2_grpc.RankWatchStub(channel)
            try:
                call = stub.WatchAlerts(service_pb2.WatchAlertsRequest(
                    training_job=self.job, after_sequence=self.last))
                with self._lock:
                    self._call = call
                for alert in call:
                    received = time.time()
                    if alert.sequence <= self.last:
                        continue
                    self.alerts.append((alert, received))
                    self.last = alert.sequence
                    if self.read_delay:
                        time.sleep(self.read_delay)
            except grpc.RpcError as e:
                self.breaks.append(e.code())
            finally:
                channel.close()
            if not self.resume:
                return
            self._stop.wait(0.3)

    def disconnect(self):
        """Drops the current stream (the thread resumes after the last alert it saw)."""
        with self._lock:
            if self._call is not None:
                self._call.cancel()

    def stop(self):
        self._stop.set()
        self.disconnect()
        self.thread.join(10)

    def sequences(self):
        return [a.sequence for a, _ in self.alerts]


def stored_alerts(address, job="", credentials=None):
    """Every alert the daemon stored (WatchAlerts with backlog_only)."""
    channel = grpc.secure_channel(address, credentials) if credentials else grpc.insecure_channel(address)
    try:
        stub = service_pb2_grpc.RankWatchStub(channel)
        return list(stub.WatchAlerts(service_pb2.WatchAlertsRequest(training_job=job, backlog_only=True),
                                     timeout=30))
    finally:
        channel.close()
