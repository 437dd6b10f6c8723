"""Object-store options: what may be printed, what is checked before Lance is called, and what a
failed open means.

Used by :mod:`~lance_prefetch.sources._lance` (which alone talks to Lance); nothing here imports ``lance``.
Storage options are passed to Lance exactly as given; this module only reads them to

- print them safely (:func:`redact`, :func:`scrub`; :func:`reraise_scrubbed` for Lance's errors),
- refuse S3 options Lance would fail on slowly or cryptically, before any I/O
  (:func:`check_s3_options`),
- find out in a bounded time whether an explicit S3-compatible endpoint answers at all
  (:func:`probe_endpoint`: Lance retries an unreachable endpoint for seconds, a hung one for
  minutes),
- turn Lance's error for a failed open into one that names the parameter and the fix
  (:func:`explain_open_error`); a read refused for its credentials (revoked since the open)
  into a ``PermissionError`` and a read of files that are gone into a ``FileNotFoundError``
  naming the version, the likely cause and the fix (:func:`explain_read_error`);
  :func:`raise_instead` raises either.
"""

from __future__ import annotations

import http.client
import os
import re
import socket
from collections.abc import Mapping
from typing import NoReturn
from urllib.parse import urlsplit, urlunsplit

from lance_prefetch._errors import lance_message

__all__ = [
    "PROBE_TIMEOUT_S",
    "check_s3_options",
    "explain_missing_files",
    "explain_open_error",
    "explain_read_error",
    "explain_refused_read",
    "is_s3",
    "probe_endpoint",
    "raise_instead",
    "redact",
    "reraise_scrubbed",
    "scrub",
]

#: Seconds :func:`probe_endpoint` waits for an endpoint to answer, unless ``storage_options``
#: sets ``connect_timeout``.
PROBE_TIMEOUT_S = 3.0

_SECRET_KEY = re.compile(
    r"key|secret|passw|token|credential|session|auth|private|signature|sas", re.IGNORECASE
)
_S3_SCHEMES = ("s3", "s3a", "s3+ddb")
# The spellings Lance (object_store) accepts for an S3 endpoint, in the order they are looked for.
_ENDPOINT_KEYS = ("aws_endpoint", "aws_endpoint_url", "endpoint", "endpoint_url")
_ALLOW_HTTP_KEYS = ("allow_http", "aws_allow_http")
_FALSY = ("false", "0", "no", "off")
_PROXY_ENV = ("http_proxy", "https_proxy", "all_proxy")
# S3 error codes that mean "these credentials may not do this" (HTTP 403 and friends).
_CREDENTIAL_CODES = frozenset(
    {
        "AccessDenied",
        "AllAccessDisabled",
        "ExpiredToken",
        "InvalidAccessKeyId",
        "InvalidToken",
        "SignatureDoesNotMatch",
        "TokenRefreshRequired",
    }
)


def redact(storage_options: Mapping[str, str] | None) -> dict[str, str] | None:
    """A copy of ``storage_options`` safe to print: values of secret-looking keys become ``'***'``.

    Keys containing ``key``, ``secret``, ``passw``, ``token``, ``credential``, ``session``,
    ``auth``, ``private``, ``signature`` or ``sas`` (any case: ``aws_access_key_id``,
    ``awsAccessKeyId``, ``apikey``, ``authorization``) are masked; endpoints and regions are kept.

    Args:
        storage_options (Mapping[str, str] | None): the options to print.

    Returns:
        dict[str, str] | None: the masked copy, or ``None`` for ``None``.
    """
    if storage_options is None:
        return None
    return {k: "***" if _SECRET_KEY.search(k) else v for k, v in storage_options.items()}


def scrub(text: str, storage_options: Mapping[str, str] | None) -> str:
    """``text`` with every value of a secret-looking key of ``storage_options`` replaced by ``***``.

    For messages built from someone else's text (Lance's errors), which may quote a credential.

    Args:
        text (str): the message to clean.
        storage_options (Mapping[str, str] | None): the options whose secret values must not
            appear (keys as in :func:`redact`).

    Returns:
        str: the cleaned text (``text`` itself when nothing matched).
    """
    secrets = [v for k, v in (storage_options or {}).items() if v and _SECRET_KEY.search(k)]
    for value in sorted(secrets, key=len, reverse=True):  # longest first: one may contain another
        text = text.replace(value, "***")
    return text


def redact_uri(uri: str) -> str:
    """``uri`` safe to print: a password in it (``scheme://user:password@host/...``) becomes
    ``***``, and a query string (which may carry a signature) is dropped."""
    parts = urlsplit(uri)
    if not parts.scheme or not (parts.password or parts.query):
        return uri
    netloc = parts.netloc
    if parts.password:
        netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", parts.fragment))


def is_s3(uri: str) -> bool:
    """Whether ``uri`` names an S3 (or S3-compatible) location: ``s3://``, ``s3a://``, ``s3+ddb://``."""
    return urlsplit(uri).scheme.lower() in _S3_SCHEMES


def check_s3_options(storage_options: Mapping[str, str] | None) -> tuple[str, str] | None:
    """Refuse S3 storage options that cannot work, before any I/O; return the explicit endpoint.

    Args:
        storage_options (Mapping[str, str] | None): options for an ``s3://`` URI (already
            checked to be ``str`` to ``str``).

    Returns:
        tuple[str, str] | None: ``(key, endpoint)`` of the endpoint set in ``storage_options``
        (``aws_endpoint``, ``aws_endpoint_url``, ``endpoint`` or ``endpoint_url``), or ``None``
        when none is set (AWS's own endpoints, or an ``AWS_ENDPOINT`` environment variable).

    Raises:
        ValueError: the endpoint is not an ``http://`` or ``https://`` URL with a host, or it is
            plain ``http://`` while ``allow_http`` is unset or false (Lance refuses such
            connections, after retrying for seconds, with only "builder error").
    """
    options = storage_options or {}
    found = _endpoint(options)
    if found is None:
        return None
    key, endpoint = found
    parts = urlsplit(endpoint)
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise ValueError(
            f"storage_options[{key!r}] should be an http:// or https:// URL with a host, like "
            f"'https://minio.example.com:9000', but got {endpoint!r}"
        )
    if parts.scheme.lower() == "http" and not _allows_http(options):
        raise ValueError(
            f"storage_options[{key!r}]={endpoint!r} is plain http, which Lance refuses unless "
            f"allowed: add storage_options['allow_http']='true' (or use https)"
        )
    return key, endpoint


def probe_endpoint(
    key: str, endpoint: str, uri: str, storage_options: Mapping[str, str] | None
) -> None:
    """Check that an explicit S3-compatible endpoint answers, within a bounded time.

    An ``http://`` endpoint must answer a ``HEAD /`` request with any HTTP status (a 403 is an
    answer); for ``https://`` a TCP connection is enough (the TLS setup is Lance's). Skipped when a
    proxy is configured (``proxy_url`` in ``storage_options`` or an ``*_proxy`` environment
    variable), since the endpoint may then be reachable only through it.

    Args:
        key (str): the ``storage_options`` key that set ``endpoint`` (for the message).
        endpoint (str): the endpoint URL, as checked by :func:`check_s3_options`.
        uri (str): the dataset URI (for the message).
        storage_options (Mapping[str, str] | None): the options; ``connect_timeout`` (``"5s"``,
            ``"500ms"``, ``"1min"`` or seconds), when set, replaces :data:`PROBE_TIMEOUT_S`.

    Raises:
        ConnectionError: nothing accepts connections there, the host does not resolve, nothing
            answered within the timeout, or what answered does not speak HTTP. The message names
            ``storage_options[key]`` and the fix.
    """
    options = storage_options or {}
    if "proxy_url" in options or any(name.lower() in _PROXY_ENV for name in os.environ):
        return
    timeout = _seconds(options.get("connect_timeout")) or PROBE_TIMEOUT_S
    parts = urlsplit(endpoint)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme.lower() == "https" else 80)
    try:
        if parts.scheme.lower() == "https":
            socket.create_connection((host, port), timeout=timeout).close()
        else:
            connection = http.client.HTTPConnection(host, port, timeout=timeout)
            try:
                connection.request("HEAD", "/")
                connection.getresponse().close()
            finally:
                connection.close()
    except ConnectionRefusedError:
        reason = f"nothing accepts connections at {host}:{port} (connection refused)"
    except socket.gaierror:
        reason = f"the host {host!r} does not resolve"
    except TimeoutError:
        reason = f"no answer within {timeout:g} s"
    except (OSError, http.client.HTTPException) as exc:
        reason = f"it does not answer HTTP ({type(exc).__name__}: {exc})"
    else:
        return
    raise ConnectionError(
        f"storage_options[{key!r}]={endpoint!r} is not reachable: {reason}; check the host, "
        f"port and scheme of the S3-compatible endpoint for {uri!r}, and that its server is "
        f"running"
    )


def explain_open_error(
    exc: BaseException,
    uri: str,
    storage_options: Mapping[str, str] | None,
    *,
    version: int | None = None,
) -> Exception | None:
    """The clear error to raise instead of Lance's ``exc`` from opening the dataset at ``uri``.

    Each names the parameter to fix (``source`` or the ``storage_options`` key) and never holds a
    secret value. Raise it ``from None``: Lance's own message may quote credentials.

    Args:
        exc (BaseException): what ``lance.dataset`` raised.
        uri (str): the dataset URI.
        storage_options (Mapping[str, str] | None): the options it was opened with.
        version (int, optional): the version being opened (a pinned one, reopened in another
            process), if any.

    Returns:
        Exception | None: ``FileNotFoundError`` (no such bucket, or no dataset at the path),
        ``PermissionError`` (credentials refused or missing), ``ConnectionError`` (the endpoint
        could not be reached), or ``None`` when the error is none of these (re-raise it, through
        :func:`scrub`).
    """
    text = str(exc)
    lowered = text.lower()
    where = _where(storage_options)
    detail = _summary(text, storage_options)
    code = _xml(text, "Code")
    if code == "NoSuchBucket":
        bucket = urlsplit(uri).netloc
        return FileNotFoundError(
            f"source: the bucket {bucket!r} of {uri!r} does not exist at {where}; check the "
            f"bucket name in source (or the endpoint, if it points at another server)"
        )
    if code in _CREDENTIAL_CODES or "403 forbidden" in lowered:
        return PermissionError(
            f"source: {where} refused the credentials for {uri!r} ({detail}); check "
            f"{_credential_options(uri)}, and that they may read the bucket"
        )
    if "failed to get aws credentials" in lowered:
        return PermissionError(
            f"source: no AWS credentials were found for {uri!r}; pass "
            f"storage_options['aws_access_key_id'] and ['aws_secret_access_key'] (they travel "
            f"with the loader into DataLoader workers)"
        )
    if version is not None and "not found" in lowered and "_versions/" in lowered:
        return FileNotFoundError(
            f"source: version {version} of {uri!r} is gone (its manifest was removed, e.g. by "
            f"cleanup_old_versions) while the loader was pinned to it; tag the version you "
            f"train on (dataset.tags.create(name, version)) and pass Dataset(uri, "
            f"version=name), so that cleanup keeps it, or build the loader again on the latest "
            f"version"
        )
    if "not found" in lowered or "not a directory" in lowered:
        return FileNotFoundError(
            f"source: no Lance dataset at {uri!r}; check the path (a Lance dataset is a "
            f"directory with a _versions/ folder) and, for object stores, storage_options"
        )
    if is_s3(uri) and (
        "error sending request" in lowered
        or "builder error" in lowered
        or "dns error" in lowered
        or "connection refused" in lowered
        or "timed out" in lowered
    ):
        return ConnectionError(
            f"source: could not reach {where} for {uri!r} ({detail}); check "
            f"storage_options['aws_endpoint'] (scheme, host and port) and, for plain http, "
            f"storage_options['allow_http']='true'"
        )
    return None


# Lance (14) on a read of a file that is gone, locally or on an object store, from a take (OSError)
# or a scan (pyarrow's ArrowInvalid): "... Not found: <root>/data/<file>.lance, <rust source>", or
# ".../_deletions/<file>.arrow" for a deletion file (<root> with or without its leading "/").
_FILE_GONE = re.compile(
    r"not found: (?:.*?/)?((?:data|_deletions)/[^/\s,]+\.(?:lance|arrow|bin))(?=[,\s]|$)",
    re.IGNORECASE,
)


def explain_missing_files(exc: BaseException, uri: str, version: int) -> FileNotFoundError | None:
    """The clear error to raise (``from exc``) instead of Lance's ``exc`` from reading rows of
    version ``version`` of ``uri`` (a ``take`` or a scan), or ``None`` to keep ``exc``.

    A ``FileNotFoundError`` (permanent: never retried) when a data or deletion file of that
    version is gone: old versions were cleaned up (``cleanup_old_versions``) after a newer one was
    written, or the files were deleted. It names the version, the file, the cause and the fix.
    """
    found = _FILE_GONE.search(str(exc))
    if found is None:
        return None
    return FileNotFoundError(
        f"the files of version {version} of {redact_uri(uri)!r} are gone (its {found.group(1)} "
        f"was not found): were old versions cleaned up (cleanup_old_versions) after a newer version "
        f"was written, or the files deleted, while the loader read version {version}? Rows of "
        f"another version are never read instead. Tag the version you train on "
        f"(dataset.tags.create(name, version)) and pass Dataset(uri, version=name), so that "
        f"cleanup keeps it, or build the loader again on the latest version"
    )


def explain_refused_read(
    exc: BaseException, uri: str, storage_options: Mapping[str, str] | None
) -> PermissionError | None:
    """The ``PermissionError`` to raise instead of Lance's ``exc`` from a read (``take`` or a
    scan) of the open dataset at ``uri`` that the object store refused for its credentials (HTTP
    403: access denied, an unknown or deactivated key, an expired token), else ``None``.

    The open succeeded with the same options, so the credentials were revoked, deactivated or
    expired since, or they may not read this object: no retry will help (``is_transient`` is
    ``False`` for it). The message names the dataset, the endpoint and the options to check, and
    never holds a secret value. Raise it ``from`` Lance's error unless that quotes a secret.

    Args:
        exc (BaseException): what the read raised.
        uri (str): the dataset URI.
        storage_options (Mapping[str, str] | None): the options it was opened with.
    """
    text = str(exc)
    lowered = text.lower()
    refused = _xml(text, "Code") in _CREDENTIAL_CODES or (
        is_s3(uri) and ("403 forbidden" in lowered or "lacked the necessary privileges" in lowered)
    )
    if not refused:
        return None
    return PermissionError(
        f"{_where(storage_options)} refused the credentials while reading {uri!r} "
        f"({_summary(text, storage_options)}); they may have been revoked, deactivated or expired "
        f"since the loader was built, or may not read this object: check "
        f"{_credential_options(uri)}"
    )


def raise_instead(
    error: Exception | None, exc: Exception, storage_options: Mapping[str, str] | None
) -> NoReturn:
    """Raise ``error`` (the clear one, from :func:`explain_open_error` or
    :func:`explain_read_error`) from Lance's ``exc``, chained for debugging unless its message
    quotes a secret value of ``storage_options``; with no ``error``, :func:`reraise_scrubbed`."""
    if error is None:
        reraise_scrubbed(exc, storage_options)
    quotes_secret = scrub(str(exc), storage_options) != str(exc)
    raise error from (None if quotes_secret else exc)


def reraise_scrubbed(exc: Exception, storage_options: Mapping[str, str] | None) -> NoReturn:
    """Re-raise ``exc``; as a copy without its chain if its message quotes a secret option value."""
    text = str(exc)
    clean = scrub(text, storage_options)
    if clean == text:
        raise exc
    try:
        copy = type(exc)(clean)
    except Exception:
        copy = OSError(f"{type(exc).__name__}: {clean}")
    raise copy from None


def explain_read_error(
    exc: BaseException, uri: str, version: int, storage_options: Mapping[str, str] | None
) -> OSError | None:
    """The clear error to raise instead of Lance's ``exc`` from a read (``take`` or a scan) of
    version ``version`` of ``uri``: :func:`explain_refused_read`'s ``PermissionError``, else
    :func:`explain_missing_files`'s ``FileNotFoundError``, else ``None`` (keep ``exc``)."""
    return explain_refused_read(exc, uri, storage_options) or explain_missing_files(
        exc, uri, version
    )


def _endpoint(options: Mapping[str, str]) -> tuple[str, str] | None:
    for key in _ENDPOINT_KEYS:
        if key in options:
            return key, options[key]
    return None


def _allows_http(options: Mapping[str, str]) -> bool:
    for key in _ALLOW_HTTP_KEYS:
        if key in options:
            return options[key].strip().lower() not in _FALSY
    value = os.environ.get("AWS_ALLOW_HTTP")
    return value is not None and value.strip().lower() not in _FALSY


def _where(options: Mapping[str, str] | None) -> str:
    """Which endpoint was asked, for messages."""
    found = _endpoint(options or {})
    if found is not None:
        return f"the endpoint storage_options[{found[0]!r}]={found[1]!r}"
    if os.environ.get("AWS_ENDPOINT") or os.environ.get("AWS_ENDPOINT_URL"):
        return "the endpoint in the AWS_ENDPOINT environment variable"
    return "the object store"


def _credential_options(uri: str) -> str:
    """The storage options that hold the credentials for ``uri``'s object store (by its
    scheme: Google Cloud Storage, Azure, else S3 and S3-compatible stores), for messages."""
    scheme = urlsplit(uri).scheme.lower()
    if scheme in ("gs", "gcs"):
        return (
            "storage_options['google_service_account'] (the path of a service account's JSON "
            "key) or ['google_service_account_key'] (the key itself)"
        )
    if scheme in ("az", "abfs", "abfss", "adl", "azure"):
        return (
            "storage_options['azure_storage_account_name'] and ['azure_storage_account_key'] "
            "(or ['azure_storage_sas_token'])"
        )
    return (
        "storage_options['aws_access_key_id'] and ['aws_secret_access_key'] (and "
        "['aws_session_token'] for temporary credentials)"
    )


def _xml(text: str, tag: str) -> str | None:
    match = re.search(rf"<{tag}>([^<]*)</{tag}>", text)
    return match.group(1) if match else None


def _summary(text: str, options: Mapping[str, str] | None) -> str:
    """A short, secret-free account of Lance's error: the S3 error code and message, else its
    text without Rust source locations, at most 300 characters."""
    code = _xml(text, "Code")
    if code is not None:
        message = _xml(text, "Message")
        summary = f"{code}: {message}" if message else code
    else:
        summary = lance_message(text)
    summary = scrub(summary, options)
    return summary if len(summary) <= 300 else summary[:297] + "..."


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|sec|secs|m|min|mins)?\s*$", re.IGNORECASE)
_UNIT_S = {"ms": 0.001, "s": 1, "sec": 1, "secs": 1, "m": 60, "min": 60, "mins": 60}


def _seconds(value: str | None) -> float | None:
    """``"5s"``, ``"500ms"``, ``"1min"`` or ``"5"`` as seconds; ``None`` if unset or not parsed
    (Lance checks the value itself)."""
    match = _DURATION.match(value) if value else None
    if match is None:
        return None
    seconds = float(match.group(1)) * _UNIT_S[(match.group(2) or "s").lower()]
    return seconds if seconds > 0 else None
