"""A fault-injecting HTTP proxy on 127.0.0.1, between Lance and the tests' S3 server.

Point Lance's ``storage_options['aws_endpoint']`` at :attr:`FaultProxy.endpoint`; every request is
forwarded to the upstream server as it came (method, path, headers in order, the ``Host`` header
the client signed included, body), so SigV4 signatures still verify, and the answer comes back.
What happens instead is switchable while it runs, by :class:`Rule`\\ s:

- ``"pass"``: forward (what happens when no rule matches);
- ``"stall"``: hold the request until the rule changes or the proxy stops (a hung request);
- ``"reset"``: drop the connection with a TCP RST, before anything is forwarded;
- ``"slow_down"`` / ``"internal_error"``: answer ``503 SlowDown`` / ``500 InternalError`` with
  S3's XML error body, before anything is forwarded;
- ``"access_denied"`` / ``"invalid_key"``: answer ``403 AccessDenied`` / ``403
  InvalidAccessKeyId`` (revoked credentials), before anything is forwarded;

and :meth:`FaultProxy.refuse` stops listening (connections refused) and resets every open
connection: the store is gone; :meth:`FaultProxy.resume` listens again on the same port.

A rule applies to every request, or to a seeded random fraction of them, optionally only to some
methods or paths; :meth:`FaultProxy.set_rule` applies one from now on. Request bodies are read by
their ``Content-Length`` (what Lance and boto3 send); answers are passed on whole, with their
length. Every request is recorded
(:attr:`FaultProxy.log`). :meth:`FaultProxy.stop` closes every socket and joins every thread it
started (threads are named ``faultproxy-*``), so no thread or port is left behind.
"""

from __future__ import annotations

import http.client
import random
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

__all__ = ["ACTIONS", "FaultProxy", "Record", "Rule"]

#: What a rule may do to a request: the action and, for an answer, its status, reason and S3
#: error code.
ACTIONS = {
    "pass": None,
    "stall": None,
    "reset": None,
    "slow_down": (503, "Slow Down", "SlowDown", "Please reduce your request rate."),
    "internal_error": (
        500,
        "Internal Server Error",
        "InternalError",
        "We encountered an internal error. Please try again.",
    ),
    "access_denied": (403, "Forbidden", "AccessDenied", "Access Denied"),
    "invalid_key": (
        403,
        "Forbidden",
        "InvalidAccessKeyId",
        "The AWS Access Key Id you provided does not exist in our records.",
    ),
}


@dataclass(frozen=True)
class Rule:
    """What the proxy does to the requests it matches.

    Args:
        action (str | tuple[str, ...]): one of :data:`ACTIONS`, or several: each request the rule
            applies to gets one of them, drawn (uniformly) from the same seeded generator.
        fraction (float): the share of matching requests it applies to, drawn from
            ``random.Random(seed)`` in the order requests arrive. Default: ``1.0`` (all).
        seed (int): the seed of that draw. Default: ``0``.
        methods (tuple[str, ...], optional): only these HTTP methods. Default: all.
        path_contains (str, optional): only paths containing this. Default: all.
    """

    action: str | tuple[str, ...]
    fraction: float = 1.0
    seed: int = 0
    methods: tuple[str, ...] | None = None
    path_contains: str | None = None

    def __post_init__(self) -> None:
        actions = (self.action,) if isinstance(self.action, str) else self.action
        if not actions or any(action not in ACTIONS for action in actions):
            raise ValueError(f"action should be one of {sorted(ACTIONS)}, but got {self.action!r}")
        if not 0.0 <= self.fraction <= 1.0:
            raise ValueError(f"fraction should be in [0, 1], but got {self.fraction}")

    def matches(self, method: str, path: str) -> bool:
        """Whether a request is one this rule is about (before the random draw)."""
        if self.methods is not None and method not in self.methods:
            return False
        return self.path_contains is None or self.path_contains in path


@dataclass(frozen=True)
class Record:
    """One request the proxy saw: when (``time.monotonic()``), what, and what it did."""

    at: float
    method: str
    path: str
    action: str
    status: int | None = None  # the status returned (upstream's or the injected one)


@dataclass
class _State:
    rule: Rule = field(default_factory=lambda: Rule("pass"))
    draw: random.Random = field(default_factory=lambda: random.Random(0))
    released: threading.Event = field(default_factory=threading.Event)


class FaultProxy:
    """A threaded HTTP/1.1 proxy on ``127.0.0.1`` (a free port) to ``upstream``.

    Args:
        upstream (str): the server's endpoint, ``http://127.0.0.1:PORT``.

    Attributes:
        endpoint (str): ``http://127.0.0.1:PORT`` of the proxy (after :meth:`start`).
        log (list[Record]): every request seen, in arrival order.
    """

    def __init__(self, upstream: str) -> None:
        host, port = upstream.removeprefix("http://").rstrip("/").rsplit(":", 1)
        self._upstream = (host, int(port))
        self._lock = threading.Lock()
        self._state = _State()
        self._listener: socket.socket | None = None
        self._port = 0
        self._stopping = threading.Event()
        self._accepting = threading.Event()  # set while listening
        self._connections: dict[socket.socket, threading.Thread] = {}
        # every connection thread not yet joined: one leaves _connections before it ends
        self._serving: list[threading.Thread] = []
        self._accept_thread: threading.Thread | None = None
        self.log: list[Record] = []
        self.endpoint = ""

    # -- control ----------------------------------------------------------------------------

    def start(self) -> FaultProxy:
        """Listen and start forwarding (no rule: everything passes)."""
        self._listen()
        self.endpoint = f"http://127.0.0.1:{self._port}"
        self._accept_thread = threading.Thread(
            target=self._accept_loop, name="faultproxy-accept", daemon=True
        )
        self._accept_thread.start()
        return self

    def set_rule(self, rule: Rule | str) -> None:
        """Apply ``rule`` (or ``Rule(action)`` for a name) to every request from now on; requests
        stalled by the previous rule go on (forwarded)."""
        rule = Rule(rule) if isinstance(rule, str) else rule
        with self._lock:
            self._state.released.set()
            self._state = _State(rule=rule, draw=random.Random(rule.seed))

    def clear(self) -> None:
        """Forward everything again (and let stalled requests go on)."""
        self.set_rule("pass")

    def refuse(self) -> None:
        """The store goes away: stop listening (new connections are refused) and reset every open
        connection."""
        with self._lock:
            listener, self._listener = self._listener, None
            self._accepting.clear()
        if listener is not None:
            try:  # a listening socket shut down refuses at once (close alone waits for accept())
                listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            listener.close()
        with self._lock:
            open_now = list(self._connections)
        for connection in open_now:
            _reset(connection)

    def resume(self) -> None:
        """The store comes back: listen again, on the same port (no-op while listening)."""
        if self._stopping.is_set():
            raise RuntimeError("the proxy is stopped")
        if not self.listening:
            self._listen(self._port)

    @property
    def listening(self) -> bool:
        """Whether new connections are accepted (not after :meth:`refuse` or :meth:`stop`)."""
        return self._accepting.is_set()

    def requests(self, *, since: float = 0.0, action: str | None = None) -> list[Record]:
        """The requests seen at or after ``since`` (``time.monotonic()``), optionally only those
        given ``action``."""
        with self._lock:
            return [r for r in self.log if r.at >= since and action in (None, r.action)]

    def stop(self) -> None:
        """Close every socket and join every thread started; idempotent."""
        self._stopping.set()
        self.refuse()
        with self._lock:
            self._state.released.set()
            threads, self._serving = self._serving, []
        if self._accept_thread is not None:
            self._accept_thread.join(timeout=5)
        for thread in threads:
            thread.join(timeout=5)

    def threads(self) -> list[threading.Thread]:
        """This module's threads still alive (none after :meth:`stop`)."""
        return [
            t for t in threading.enumerate() if t.name.startswith("faultproxy") and t.is_alive()
        ]

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- serving ----------------------------------------------------------------------------

    def _listen(self, port: int = 0) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(64)
        listener.settimeout(0.02)
        with self._lock:
            self._listener = listener
            self._port = listener.getsockname()[1]
            self._accepting.set()

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            if not self._accepting.wait(0.02):
                continue
            listener = self._listener
            if listener is None:
                continue
            try:
                connection, _ = listener.accept()
            except (TimeoutError, OSError):  # a timeout, or closed by refuse()
                continue
            connection.settimeout(None)
            thread = threading.Thread(
                target=self._serve, args=(connection,), name="faultproxy-connection", daemon=True
            )
            with self._lock:  # started under the lock: stop() joins only started threads
                if self._stopping.is_set():
                    connection.close()
                    return
                self._connections[connection] = thread
                self._serving = [t for t in self._serving if t.is_alive()]
                self._serving.append(thread)
                thread.start()

    def _serve(self, connection: socket.socket) -> None:
        upstream = http.client.HTTPConnection(*self._upstream, timeout=30)
        try:
            _Handler(connection, self, upstream)
        except OSError:
            pass  # the client went away, or refuse()/stop() reset the connection
        finally:
            upstream.close()
            with self._lock:
                self._connections.pop(connection, None)
            try:
                connection.close()
            except OSError:
                pass

    def _decide(self, method: str, path: str) -> tuple[str, threading.Event]:
        with self._lock:
            state = self._state
            rule = state.rule
            action = "pass"
            if rule.matches(method, path) and (
                rule.fraction >= 1.0 or state.draw.random() < rule.fraction
            ):
                action = rule.action
                if not isinstance(action, str):
                    action = action[0] if len(action) == 1 else state.draw.choice(action)
            return action, state.released

    def _record(self, record: Record) -> None:
        with self._lock:
            self.log.append(record)


def _reset(connection: socket.socket, *, wake: bool = True) -> None:
    """Make the close of ``connection`` a TCP RST (SO_LINGER 0) instead of a FIN; ``wake``: also
    shut it down, so that the thread serving it (blocked in a read) wakes up and closes it."""
    try:
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        if wake:
            connection.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


class _Reset(Exception):
    """Drop this connection with a RST."""


class _Handler(BaseHTTPRequestHandler):
    """One client connection: each request decided by the proxy's rule, then forwarded."""

    protocol_version = "HTTP/1.1"  # keep-alive, as Lance's client expects

    def __init__(self, connection, proxy: FaultProxy, upstream: http.client.HTTPConnection):
        self.proxy, self.upstream = proxy, upstream
        super().__init__(connection, connection.getpeername(), None)

    def handle_one_request(self) -> None:
        try:
            super().handle_one_request()
        except _Reset:  # this thread closes the connection next: with a RST, nothing else sent
            _reset(self.connection, wake=False)
            self.close_connection = True

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002  (no line a request)
        pass

    def _proxy(self) -> None:
        method, path = self.command, self.path
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        action, released = self.proxy._decide(method, path)
        at = time.monotonic()
        if action in ("stall", "reset"):
            self.proxy._record(Record(at, method, path, action))
        if action == "stall":  # until the rule changes (then forwarded) or the proxy stops
            while not released.wait(0.05):
                if self.proxy._stopping.is_set():
                    raise _Reset
        elif action == "reset":
            raise _Reset
        if ACTIONS[action] is not None:
            status, reason, code, message = ACTIONS[action]
            self.proxy._record(Record(at, method, path, action, status))
            self._answer(status, reason, _error_body(code, message, path))
            return
        status, reason, headers, payload = self._forward(method, path, body)
        if action == "pass":
            self.proxy._record(Record(at, method, path, action, status))
        self.send_response_only(status, reason)
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        if method != "HEAD" and payload:
            self.wfile.write(payload)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _proxy  # every S3 method alike

    def _forward(self, method, path, body):
        upstream = self.upstream
        try:
            upstream.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            for name, value in self.headers.items():  # the order and spelling the client signed
                upstream.putheader(name, value)
            upstream.endheaders(body)
            response = upstream.getresponse()
            payload = response.read()
        except (OSError, http.client.HTTPException):
            upstream.close()  # the server is gone: the client sees its connection dropped
            raise _Reset from None
        headers = [
            (name, value)
            for name, value in response.getheaders()
            if name.lower() not in ("transfer-encoding", "connection", "content-length")
        ]
        if method == "HEAD":  # no body: keep the length the server declared
            declared = response.getheader("Content-Length")
            headers.append(("Content-Length", declared if declared is not None else "0"))
        else:
            headers.append(("Content-Length", str(len(payload))))
        if response.will_close:
            upstream.close()
        return response.status, response.reason, headers, payload

    def _answer(self, status: int, reason: str, body: bytes) -> None:
        self.send_response_only(status, reason)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("x-amz-request-id", "faultproxy")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


def _error_body(code: str, message: str, path: str) -> bytes:
    resource = path.split("?", 1)[0]
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
        f"<Message>{message}</Message><Resource>{resource}</Resource>"
        f"<RequestId>faultproxy</RequestId></Error>"
    ).encode()
