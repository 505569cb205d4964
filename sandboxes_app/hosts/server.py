"""A sandbox host's internal endpoint: POST /call with a signed JSON body {method, kwargs}.

Interactive calls (a command's run, a probe, a log read) come here rather than through the
host's Celery queue: one keep-alive HTTP request on the internal network costs about a
millisecond, a queue round trip several. Only INTERACTIVE_METHODS are served; the lifecycle
goes through Celery. Plain HTTP: put it on a private network (or behind TLS) between the web,
the worker and the hosts; the signature keeps anyone else out, not eavesdroppers.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from sandboxes_app.hosts.auth import HEADER, signature_valid
from sandboxes_app.hosts.dispatch import INTERACTIVE_METHODS, host_dispatch

logger = logging.getLogger("recoup.hosts")

# A command's argv and env are the largest thing a call carries (the API caps its body at
# API_MAX_BODY_BYTES); a read of a log answers at most about 1 MiB.
MAX_BODY = 16 * 1024 * 1024


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the caller reuses one connection per thread
    # A connection that sends nothing for this long is closed, so idle or stalled ones (a slow
    # sender holding a thread) do not pile up; a call's own run time does not count.
    timeout = 300
    server: HostServer

    def setup(self) -> None:
        super().setup()
        # The headers and the body go out as two writes; with Nagle's algorithm the second
        # waits for the caller's delayed ACK, 40 ms on Linux, on every call.
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        if self.path != "/call":
            return self._answer(404, {"error": {"type": "ProviderError", "message": "not found"}})
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY:
            self.close_connection = True
            return self._answer(413, {"error": {"type": "ProviderError", "message": "size"}})
        body = self.rfile.read(length)
        if not signature_valid(
            secret=self.server.secret, header=self.headers.get(HEADER, ""), body=body
        ):
            logger.warning("refused an unsigned host call from %s", self.client_address[0])
            return self._answer(403, {"error": {"type": "ProviderError", "message": "forbidden"}})
        try:
            message = json.loads(body)
            method, kwargs = str(message["method"]), message["kwargs"]
        except (ValueError, KeyError, TypeError):
            return self._answer(400, {"error": {"type": "ProviderError", "message": "bad call"}})
        reply = host_dispatch(method=method, kwargs=kwargs, allowed=INTERACTIVE_METHODS)
        self._answer(200, reply)

    def _answer(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass  # one line per call would drown the host's log; refusals are logged above


class HostServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], *, secret: bytes) -> None:
        super().__init__(address, _Handler)
        self.secret = secret

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, name="host-endpoint", daemon=True)
        thread.start()
        return thread
