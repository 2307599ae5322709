"""A stand-in for an S3 server that keeps `..` segments in object keys, as AWS S3 does.

SeaweedFS refuses every way of storing such a key: PutObject, multipart uploads,
CopyObject, a presigned POST form and percent-encoded dots all answer InvalidRequest; its
filer normalizes `..` away; and entries named `..` loaded into its metadata (`weed shell`
`fs.meta.load`) are left out of listings and refused by GetObject. So the object is
stored under a placeholder segment of the same length, `~~`, and this proxy in front of
SeaweedFS shows `~~` as `..` to its clients both ways: in listings, and in the keys they
ask for. Everything else is SeaweedFS's own answer.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

from shoal.queue.embedded import free_port

__all__ = ["PLACEHOLDER", "DotSegmentProxy"]

PLACEHOLDER = "~~"
"""The segment stored in SeaweedFS in place of `..` (botocore leaves `~` unencoded)."""
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


class DotSegmentProxy:
    """An HTTP proxy on a free loopback port in front of an S3 endpoint."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.port = free_port()
        self.requests: list[str] = []
        """Every request path as it arrived, `..` segments included."""
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> DotSegmentProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self
        client = httpx.Client(base_url=self.upstream, timeout=30)

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet: pytest shows failures
                pass

            def _forward(self) -> None:
                proxy.requests.append(self.path)
                path, _, query = self.path.partition("?")
                path = "/".join(PLACEHOLDER if s == ".." else s for s in path.split("/"))
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                target = path + (f"?{query}" if query else "")
                answer = client.request(self.command, target, headers=headers, content=body)
                content = answer.content
                if "xml" in answer.headers.get("content-type", ""):
                    content = content.replace(PLACEHOLDER.encode(), b"..")
                self.send_response(answer.status_code)
                for key, value in answer.headers.items():
                    if key.lower() not in _HOP_BY_HOP:
                        self.send_header(key, value)
                self.send_header("content-length", str(len(content)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(content)

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

        return Handler
