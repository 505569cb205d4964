"""A private git host for tests: git's smart HTTP protocol (`git http-backend`) over the bare
repositories of an Origins directory, on 127.0.0.1.

Owners listed in `tokens` are private, as on GitHub: a request without one of that owner's
tokens, sent as `Authorization: Basic base64(x-access-token:TOKEN)`, answers 401 whether the
repository exists or not. Every request's owner and Authorization header are recorded, so a
test can show which credentials git offered to whom.
"""

from __future__ import annotations

import base64
import subprocess
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


def basic_auth(token: str) -> str:
    return "Basic " + base64.b64encode(f"x-access-token:{token}".encode()).decode()


@dataclass(frozen=True)
class Seen:
    owner: str
    authorization: str | None


class GitHttpServer:
    """Use as a context manager; `base_url` is what SANDBOX_GIT_BASE_URL points at."""

    def __init__(self, root: Path, tokens: dict[str, set[str]]) -> None:
        self.root = root
        self.tokens = tokens
        self.seen: list[Seen] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server._serve(self)

            def do_POST(self) -> None:
                server._serve(self)

            def log_message(self, *args: object) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def __enter__(self) -> GitHttpServer:
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def _serve(self, request: BaseHTTPRequestHandler) -> None:
        url = urlsplit(request.path)
        path = unquote(url.path)
        owner = path.split("/")[1] if path.count("/") > 1 else ""
        authorization = request.headers.get("Authorization")
        self.seen.append(Seen(owner=owner, authorization=authorization))
        allowed = {basic_auth(token) for token in self.tokens.get(owner, ())}
        if owner in self.tokens and authorization not in allowed:
            request.send_response(401)
            request.send_header("WWW-Authenticate", 'Basic realm="git"')
            request.send_header("Content-Length", "0")
            request.end_headers()
            return
        # git's requests here are small: always a Content-Length, never chunked.
        body = request.rfile.read(int(request.headers.get("Content-Length") or 0))
        cgi = subprocess.run(
            ["git", "http-backend"],
            input=body,
            capture_output=True,
            env={
                "PATH": "/usr/bin:/bin",
                "GIT_PROJECT_ROOT": str(self.root),
                "GIT_HTTP_EXPORT_ALL": "1",
                "GIT_CONFIG_NOSYSTEM": "1",
                "HOME": "/nonexistent",
                "REQUEST_METHOD": request.command,
                "PATH_INFO": path,
                "QUERY_STRING": url.query,
                "CONTENT_TYPE": request.headers.get("Content-Type", ""),
                "CONTENT_LENGTH": str(len(body)),
                "HTTP_CONTENT_ENCODING": request.headers.get("Content-Encoding", ""),
                "HTTP_GIT_PROTOCOL": request.headers.get("Git-Protocol", ""),
                "REMOTE_ADDR": "127.0.0.1",
            },
        )
        head, _, payload = cgi.stdout.partition(b"\r\n\r\n")
        status, headers = 200, []
        for line in head.decode().split("\r\n"):
            name, _, value = line.partition(":")
            if name.lower() == "status":
                status = int(value.split()[0])
            elif name:
                headers.append((name, value.strip()))
        request.send_response(status)
        for name, value in headers:
            request.send_header(name, value)
        request.send_header("Content-Length", str(len(payload)))
        request.end_headers()
        request.wfile.write(payload)
