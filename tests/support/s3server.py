"""A real S3-compatible HTTP server on 127.0.0.1 for the tests: moto, checking request signatures.

Start it with ``S3Server().start()`` (the ``s3`` session fixture in ``conftest.py`` does) and stop it
with :meth:`S3Server.stop`, which also closes the kept-alive client connections and joins every
thread the server started, so no thread or port is left behind.

The server checks signatures like AWS does: only the access key it creates at start (an IAM user
allowed everything) is accepted, so a wrong secret fails, and an unsigned request gets 403.
Keep objects small: moto copies the whole object for every range GET.
"""

from __future__ import annotations

import json
import logging
import socket
import threading

import boto3
from moto import settings as moto_settings
from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import ThreadedWSGIServer

REGION = "us-east-1"
_ANONYMOUS_DENIED = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code>'
    b"<Message>Access Denied</Message></Error>"
)


def _deny_anonymous(app):
    """Answer unsigned requests 403 AccessDenied, as AWS does (moto, checking signatures, fails
    them with a 500 and a logged traceback)."""

    def wsgi(environ, start_response):
        signed = "HTTP_AUTHORIZATION" in environ or "X-Amz-Signature=" in environ.get(
            "QUERY_STRING", ""
        )
        if signed:
            return app(environ, start_response)
        start_response("403 Forbidden", [("Content-Type", "application/xml")])
        return [_ANONYMOUS_DENIED]

    return wsgi


_SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)


class Faults:
    """Faults the server injects into GETs of data files (``.../data/*.lance``), switchable while
    it runs. Reset with :meth:`clear` (which also lets every held request go on).

    Attributes:
        hang (int): the next ``hang`` data GETs are held until :meth:`clear` (a hung request).
        held (int): data GETs held so far.
        slow_down (int): the next ``slow_down`` data GETs are answered ``503 Slow Down``, as S3
            answers a client over its request rate.
        slowed (int): data GETs answered 503 so far.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._released = threading.Event()
        self.hang = 0
        self.held = 0
        self.slow_down = 0
        self.slowed = 0

    def clear(self) -> None:
        with self._lock:
            self.hang = self.slow_down = 0
            self._released.set()
            self._released = threading.Event()

    def wrap(self, app):
        def wsgi(environ, start_response):
            path = environ.get("PATH_INFO", "")
            if environ["REQUEST_METHOD"] == "GET" and "/data/" in path:
                with self._lock:
                    slow_down = self.slow_down > 0
                    if slow_down:
                        self.slow_down -= 1
                        self.slowed += 1
                if slow_down:
                    start_response("503 Slow Down", [("Content-Type", "application/xml")])
                    return [_SLOW_DOWN]
                with self._lock:
                    released = self._released if self.hang > 0 else None
                    if released is not None:
                        self.hang -= 1
                        self.held += 1
                if released is not None:
                    released.wait(60)
            return app(environ, start_response)

        return wsgi


class _TrackingServer(ThreadedWSGIServer):
    """werkzeug's threaded server, remembering each open connection and the thread serving it."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.lock = threading.Lock()
        self.open: dict[socket.socket, threading.Thread] = {}

    def process_request(self, request, client_address) -> None:
        thread = threading.Thread(
            target=self._serve, args=(request, client_address), name="s3server-request"
        )
        thread.daemon = True
        with self.lock:
            self.open[request] = thread
        thread.start()

    def _serve(self, request, client_address) -> None:
        try:
            self.process_request_thread(request, client_address)
        finally:
            with self.lock:
                self.open.pop(request, None)


class S3Server:
    """moto's S3 (and IAM) on ``127.0.0.1``, a free port, with signature checks on.

    Attributes (after :meth:`start`):
        endpoint (str): ``http://127.0.0.1:PORT``.
        access_key_id (str), secret_access_key (str): the only credentials it accepts.
        faults (Faults): faults to inject into data reads (none until set).
    """

    def __init__(self) -> None:
        self.faults = Faults()
        self.endpoint = ""
        self.access_key_id = ""
        self.secret_access_key = ""
        self._server: _TrackingServer | None = None
        self._thread: threading.Thread | None = None
        self._previous_auth = moto_settings.INITIAL_NO_AUTH_ACTION_COUNT
        self._werkzeug_level = logging.getLogger("werkzeug").level

    def start(self) -> S3Server:
        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
        app = self.faults.wrap(_deny_anonymous(DomainDispatcherApplication(create_backend_app)))
        self._server = _TrackingServer("127.0.0.1", 0, app, handler=MotoRequestHandler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="s3server", daemon=True
        )
        self._thread.start()
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        # Signatures are not checked yet: create the one user (allowed everything) and its key,
        # then turn checks on. moto reads this setting on every request, in this process.
        iam = self.client("iam", access_key_id="setup", secret_access_key="setup")
        iam.create_user(UserName="loader")
        iam.put_user_policy(
            UserName="loader",
            PolicyName="everything",
            PolicyDocument=json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}],
                }
            ),
        )
        key = iam.create_access_key(UserName="loader")["AccessKey"]
        self.access_key_id, self.secret_access_key = key["AccessKeyId"], key["SecretAccessKey"]
        moto_settings.INITIAL_NO_AUTH_ACTION_COUNT = 0
        return self

    def stop(self) -> None:
        """Stop serving, close every client connection, join the threads and free the port."""
        server, self._server = self._server, None
        if server is None:
            return
        self.faults.clear()  # held requests go on, so their threads can end
        try:
            server.shutdown()  # serve_forever returns; no new connection is accepted
            with server.lock:
                open_now = list(server.open.items())
            for connection, _ in open_now:  # kept-alive connections: wake their threads
                try:
                    connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            for _, thread in open_now:
                thread.join(timeout=5)
            server.server_close()
            if self._thread is not None:
                self._thread.join(timeout=5)
        finally:
            moto_settings.INITIAL_NO_AUTH_ACTION_COUNT = self._previous_auth
            logging.getLogger("werkzeug").setLevel(self._werkzeug_level)

    def threads(self) -> list[threading.Thread]:
        """Threads of this server still alive (none after :meth:`stop`)."""
        return [t for t in threading.enumerate() if t.name.startswith("s3server") and t.is_alive()]

    def storage_options(self, **overrides: str) -> dict[str, str]:
        """Lance storage options for this server (the credentials included); ``overrides`` win."""
        options = {
            "aws_access_key_id": self.access_key_id,
            "aws_secret_access_key": self.secret_access_key,
            "aws_region": REGION,
            "aws_endpoint": self.endpoint,
            "allow_http": "true",
        }
        options.update(overrides)
        return options

    def client(self, service: str = "s3", *, access_key_id=None, secret_access_key=None):
        """A boto3 client for this server (its credentials unless given)."""
        return boto3.client(
            service,
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=access_key_id or self.access_key_id,
            aws_secret_access_key=secret_access_key or self.secret_access_key,
        )

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def closed_port() -> int:
    """A port on 127.0.0.1 where nothing listens (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class SilentServer:
    """Accepts TCP connections on 127.0.0.1 and never answers: a hung endpoint.

    Use as a context manager; leaving it closes the listening socket and every accepted one and
    joins its thread.
    """

    def __init__(self) -> None:
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self._listener.settimeout(0.05)
        self.port = self._listener.getsockname()[1]
        self._accepted: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="s3server-silent", daemon=True)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                connection, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._accepted.append(connection)

    def __enter__(self) -> SilentServer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for connection in self._accepted:
            connection.close()
        self._listener.close()


def _serve_in_this_process() -> None:
    """``python s3server.py BUCKET``: serve until stdin closes or SIGTERM, in a process of its own
    (moto's backends are per process), after printing the endpoint and the credentials as one
    line of JSON."""
    import signal
    import sys

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with S3Server() as server:
        server.client().create_bucket(Bucket=sys.argv[1])
        print(  # noqa: T201  (the parent reads this line)
            json.dumps(
                {
                    "endpoint": server.endpoint,
                    "access_key_id": server.access_key_id,
                    "secret_access_key": server.secret_access_key,
                }
            ),
            flush=True,
        )
        sys.stdin.read()


if __name__ == "__main__":
    _serve_in_this_process()
