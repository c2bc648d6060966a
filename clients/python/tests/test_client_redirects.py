"""The client against servers of this process: no controller needed."""

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import servemesh
from servemesh import Client


def _server(handler):
    s = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=s.serve_forever, daemon=True).start()
    return s


def test_the_token_never_follows_a_redirect(tmp_path):
    # Issue 34: a redirect from the API's address sent the bearer token to
    # the host it named.
    seen = []

    class Elsewhere(BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.headers.get("Authorization"))
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    other = _server(Elsewhere)

    class Redirecting(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(307)
            self.send_header("Location", f"http://127.0.0.1:{other.server_address[1]}{self.path}")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    api = _server(Redirecting)
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    token.chmod(0o600)
    try:
        with pytest.raises(servemesh.ServemeshError) as e:
            Client(f"127.0.0.1:{api.server_address[1]}", token_file=str(token), failover_wait=0).leader()
        assert e.value.status == 307
        assert seen == [], f"the redirect was followed, with Authorization {seen}"
    finally:
        api.shutdown()
        other.shutdown()
