"""Receivers for the e2e tests of the outbound alert paths: an HTTP server on 127.0.0.1 (port
bound to 0) that keeps every POST it gets — a webhook of the action policy, checking each call's
X-Rankwatch-Signature against its own secret, or an Alertmanager receiver (webhook_configs)."""
import hashlib
import hmac
import http.server
import json
import threading


class Receiver:
    """Every POST as {"path", "headers", "body" (bytes), "json", "signature_ok"}; `secret`
    (bytes) checks the signature, None skips it."""

    def __init__(self, secret=None, status=200):
        self.secret = secret
        self.status = status
        self.posts = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                receiver.record(self.path, dict(self.headers), body)
                self.send_response(receiver.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self):
        return "http://127.0.0.1:%d/hook" % self.server.server_address[1]

    def record(self, path, headers, body):
        ok = None
        if self.secret is not None:
            expected = "sha256=" + hmac.new(self.secret, body, hashlib.sha256).hexdigest()
            ok = hmac.compare_digest(expected, headers.get("X-Rankwatch-Signature", ""))
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = None
        with self._lock:
            self.posts.append({"path": path, "headers": headers, "body": body, "json": parsed,
                               "signature_ok": ok})

    def received(self):
        with self._lock:
            return list(self.posts)

    def close(self):
        self.server.shutdown()
        self.server.server_close()
