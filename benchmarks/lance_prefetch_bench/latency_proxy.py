"""A TCP proxy on 127.0.0.1 that adds request latency: delay, jitter and a slow tail.

Standard library only, and no imports from ``lance_prefetch``: :mod:`~lance_prefetch_bench.local_s3`
runs this file as a script in its own process (so its event loop does not compete for the GIL with
the benchmark), and prints nothing but the port it listens on.

How latency is added. HTTP/1.1 clients (Lance's object store client among them) send one request at
a time on a connection and wait for its response. The proxy notes when the first bytes of a request
arrive from the client and draws that request's delay; the first bytes of the response are held
until ``request time + delay``, the rest of the response follows at once. A request whose server
answers later than that is not delayed further. So every request sees at least ``delay``, whatever
its size, like a round trip to a distant store (bandwidth is not limited).

Each request's delay in milliseconds is ``delay_ms + uniform(-jitter_ms, +jitter_ms)``, plus
``tail_ms`` with probability ``tail_fraction``, never below 0, drawn from ``random.Random(seed)``
(the draws are repeatable, their assignment to concurrent requests depends on arrival order).

Run it directly::

    python latency_proxy.py --upstream 127.0.0.1:9000 [--port 0] [--delay-ms 30] [--jitter-ms 10]
        [--tail-fraction 0.01] [--tail-ms 150] [--seed 0]

It prints ``listening on 127.0.0.1:PORT`` once it accepts connections and stops on SIGTERM or
SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import signal
import sys
from dataclasses import dataclass

__all__ = ["Latency", "serve"]

HOST = "127.0.0.1"


@dataclass(frozen=True, kw_only=True)
class Latency:
    """The latency added to each request, in milliseconds.

    Args:
        delay_ms (float): mean added delay, ``>= 0``. Default: ``30.0``.
        jitter_ms (float): uniform jitter around it, ``+/- jitter_ms``, ``>= 0``. Default: ``10.0``.
        tail_fraction (float): fraction of requests, in ``[0, 1]``, that get ``tail_ms`` more.
            Default: ``0.01``.
        tail_ms (float): the slow tail's extra delay, ``>= 0``. Default: ``150.0``.
        seed (int): seed of the delay draws. Default: ``0``.

    Raises:
        ValueError: a value is out of range.
    """

    delay_ms: float = 30.0
    jitter_ms: float = 10.0
    tail_fraction: float = 0.01
    tail_ms: float = 150.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("delay_ms", "jitter_ms", "tail_ms"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} should be >= 0, but got {name}={getattr(self, name)}")
        if not 0 <= self.tail_fraction <= 1:
            raise ValueError(
                f"tail_fraction should be in [0, 1], but got tail_fraction={self.tail_fraction}"
            )

    def sampler(self) -> _DelaySampler:
        """A seeded source of per-request delays, in seconds."""
        return _DelaySampler(self)

    def describe(self) -> str:
        """E.g. ``'30 ms +/- 10 ms, 1% +150 ms'``."""
        return (
            f"{self.delay_ms:g} ms +/- {self.jitter_ms:g} ms, "
            f"{self.tail_fraction:.0%} +{self.tail_ms:g} ms"
        )

    def as_args(self) -> list[str]:
        """Command-line arguments of this script that give this latency."""
        return [
            f"--delay-ms={self.delay_ms}",
            f"--jitter-ms={self.jitter_ms}",
            f"--tail-fraction={self.tail_fraction}",
            f"--tail-ms={self.tail_ms}",
            f"--seed={self.seed}",
        ]


class _DelaySampler:
    def __init__(self, latency: Latency) -> None:
        self._latency = latency
        self._rng = random.Random(latency.seed)

    def __call__(self) -> float:
        latency, rng = self._latency, self._rng
        delay = latency.delay_ms + rng.uniform(-latency.jitter_ms, latency.jitter_ms)
        if rng.random() < latency.tail_fraction:
            delay += latency.tail_ms
        return max(delay, 0.0) / 1000


class _ClientSide(asyncio.Protocol):
    """One client connection, paired with one connection to the upstream server.

    Reading from the upstream is paused while a response's first bytes are held back and while the
    client's write buffer is full; reading from the client is paused while the upstream's write
    buffer is full (backpressure both ways).
    """

    def __init__(self, upstream: tuple[str, int], next_delay) -> None:
        self._upstream_address = upstream
        self._next_delay = next_delay
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._upstream: asyncio.Transport | None = None
        self._to_upstream: list[bytes] = []  # client bytes that arrived before upstream connected
        self._waiting_for_response = False  # a request was sent, no response byte seen yet
        self._due = 0.0  # loop time before which the response's first byte is held
        self._held: list[bytes] | None = None  # response bytes held back until _due
        self._client_full = False  # the client's write buffer is above its high-water mark
        self._closed = False

    # -- client side -----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._loop.create_task(self._connect())

    async def _connect(self) -> None:
        try:
            transport, _ = await self._loop.create_connection(
                lambda: _UpstreamSide(self), *self._upstream_address
            )
        except OSError:
            self._close()
            return
        if self._closed:
            transport.close()
            return
        self._upstream = transport  # type: ignore[assignment]
        if self._to_upstream:
            self._upstream.write(b"".join(self._to_upstream))
            self._to_upstream.clear()

    def data_received(self, data: bytes) -> None:
        if not self._waiting_for_response:
            self._waiting_for_response = True
            self._due = self._loop.time() + self._next_delay()
        if self._upstream is None:
            self._to_upstream.append(data)
        else:
            self._upstream.write(data)

    def eof_received(self) -> bool:
        self._close()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._close()

    def pause_writing(self) -> None:
        self._client_full = True
        self._update_upstream_reading()

    def resume_writing(self) -> None:
        self._client_full = False
        self._update_upstream_reading()

    # -- upstream side ---------------------------------------------------------------------------
    def response_received(self, data: bytes) -> None:
        if self._held is not None:
            self._held.append(data)
            return
        if self._waiting_for_response:
            self._waiting_for_response = False
            wait = self._due - self._loop.time()
            if wait > 0:
                self._held = [data]
                self._update_upstream_reading()
                self._loop.call_later(wait, self._release)
                return
        self._transport.write(data)

    def _release(self) -> None:
        held, self._held = self._held, None
        if self._closed or held is None:
            return
        self._transport.write(b"".join(held))
        self._update_upstream_reading()
        if self._upstream is None or self._upstream.is_closing():
            self._transport.close()  # the upstream finished while the response was held

    def upstream_lost(self) -> None:
        if self._held is None:  # otherwise _release sends what is held, then closes
            self._close()

    def upstream_full(self, full: bool) -> None:
        if self._transport is not None and not self._transport.is_closing():
            if full:
                self._transport.pause_reading()
            else:
                self._transport.resume_reading()

    def _update_upstream_reading(self) -> None:
        upstream = self._upstream
        if upstream is None or upstream.is_closing():
            return
        if self._held is not None or self._client_full:
            upstream.pause_reading()
        else:
            upstream.resume_reading()

    def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._transport is not None:
            self._transport.close()
        if self._upstream is not None:
            self._upstream.close()


class _UpstreamSide(asyncio.Protocol):
    def __init__(self, client: _ClientSide) -> None:
        self._client = client

    def data_received(self, data: bytes) -> None:
        self._client.response_received(data)

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self._client.upstream_lost()

    def pause_writing(self) -> None:
        self._client.upstream_full(True)

    def resume_writing(self) -> None:
        self._client.upstream_full(False)


async def serve(upstream: tuple[str, int], latency: Latency, *, port: int = 0, ready=None) -> None:
    """Proxy ``127.0.0.1:port`` to ``upstream`` with ``latency`` until cancelled.

    Args:
        upstream (tuple[str, int]): the server's host and port.
        latency (Latency): what to add to each request.
        port (int): port to listen on; ``0`` picks a free one. Default: ``0``.
        ready (Callable[[int], None], optional): called with the port once connections are
            accepted. Default: ``None``.

    Cancellation handling:
        Cancelling stops accepting connections and closes the listening socket; connections
        still open are closed with the event loop.
    """
    next_delay = latency.sampler()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: _ClientSide(upstream, next_delay), HOST, port, reuse_address=True
    )
    async with server:
        if ready is not None:
            ready(server.sockets[0].getsockname()[1])
        await server.serve_forever()


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--upstream", required=True, help="HOST:PORT of the server")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (0: any free)")
    parser.add_argument("--delay-ms", type=float, default=30.0)
    parser.add_argument("--jitter-ms", type=float, default=10.0)
    parser.add_argument("--tail-fraction", type=float, default=0.01)
    parser.add_argument("--tail-ms", type=float, default=150.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    host, _, port = args.upstream.rpartition(":")
    latency = Latency(
        delay_ms=args.delay_ms,
        jitter_ms=args.jitter_ms,
        tail_fraction=args.tail_fraction,
        tail_ms=args.tail_ms,
        seed=args.seed,
    )

    def ready(bound: int) -> None:
        sys.stdout.write(f"listening on {HOST}:{bound}\n")
        sys.stdout.flush()

    async def run() -> None:
        task = asyncio.ensure_future(serve((host, int(port)), latency, port=args.port, ready=ready))
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, task.cancel)
        try:
            await task
        except asyncio.CancelledError:
            pass

    try:  # a faster event loop, when installed (the bench extra brings it): less CPU per request
        import uvloop
    except ModuleNotFoundError:
        asyncio.run(run())
    else:
        uvloop.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(_main())
