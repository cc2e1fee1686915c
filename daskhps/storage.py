"""Where bytes live: local paths, and fsspec URLs (``s3://``, ``gs://``, ``abfs://``,
``hdfs://``, ``file://`` and any protocol whose fsspec package is installed).

A local path (or a ``file://`` URL) keeps the fast local calls (``os``, ``glob``, ``open``);
a URL goes through fsspec. Storage options (endpoint, credentials, retries) come from, in
this order: the run config's ``storage.options`` (:func:`use_options`, applied on the driver
and on every worker), fsspec's environment variables (``FSSPEC_S3_ENDPOINT_URL=...``) and
config files, and the packages' own sources (``AWS_*`` variables, ``~/.aws``,
``GOOGLE_APPLICATION_CREDENTIALS``, ...). Each option must be one the protocol's filesystem
takes (:func:`option_names`, checked when the config is read), and where the user set no
retries daskhps sets its own, so that a store that cannot be reached is said in seconds
(:mod:`daskhps._store_options`). Credentials are never printed: every message shows a URL
through :func:`shown`, which leaves them out, and every log line is masked
(:mod:`daskhps._redact`).

A bucket is never created: a write to an object store makes no folders (:func:`make_folder`),
and a bucket that does not exist is refused.

A failure of the store itself (no such bucket, access denied, no connection, an object gone)
is a :class:`~daskhps.errors.StorageError`: one line naming the URL and what would fix it
(:func:`failure`). Bad bytes in an object that could be read stay bad rows, as in a file.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import IO, Any

import fsspec
from fsspec.spec import AbstractFileSystem

from daskhps import _redact
from daskhps._store_options import option_names, url_to_fs
from daskhps.errors import StorageError, first_line

__all__ = [
    "EXTRAS",
    "bucket_of",
    "check_bucket",
    "exists",
    "failure",
    "file_size",
    "filesystem",
    "folder_of",
    "is_url",
    "local_path",
    "make_folder",
    "no_such_bucket",
    "open_input",
    "option_names",
    "protocol_of",
    "reason",
    "shown",
    "stamp",
    "transport_failure",
    "url_to_fs",
    "use_options",
]

# protocol -> (the package that reads it, the daskhps extra that installs it)
EXTRAS: dict[str, tuple[str, str | None]] = {
    "s3": ("s3fs", "s3"),
    "s3a": ("s3fs", "s3"),
    "gs": ("gcsfs", "gcs"),
    "gcs": ("gcsfs", "gcs"),
    "abfs": ("adlfs", "azure"),
    "abfss": ("adlfs", "azure"),
    "az": ("adlfs", "azure"),
    "hdfs": ("pyarrow", None),
}
_LOCAL = ("file", "local")
_URL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")
_CREDENTIALS = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*://)[^/@]*@")
_BUCKETS = ("s3", "s3a", "gs", "gcs", "abfs", "abfss", "az")  # first path part: the bucket


def protocol_of(path: str) -> str | None:
    """The protocol of a URL (``s3``), None for a plain path."""
    m = _URL.match(str(path))
    return m.group(1).lower() if m else None


def is_url(path: str) -> bool:
    """True for a URL that fsspec reads (anything but a plain path or ``file://``)."""
    return protocol_of(path) not in (None, *_LOCAL)


def local_path(path: str) -> str:
    """A plain path for a plain path or a ``file://`` URL."""
    p = str(path)
    if protocol_of(p) in _LOCAL:
        return p.split("://", 1)[1]
    return p


def shown(url: str) -> str:
    """``url`` fit to print: credentials written into it (``user:secret@``) and its query
    (``?sig=...``, signed URLs) left out."""
    url = _CREDENTIALS.sub(r"\1", str(url))
    return url.split("?", 1)[0] if is_url(url) else url


_SET: dict[str, Any] = {}  # protocol -> what fsspec's config held before use_options set it


def use_options(options: Mapping[str, Mapping[str, Any]], *, replace: bool = False) -> None:
    """Make ``options`` (``{protocol: {option: value}}``) the defaults of every filesystem
    this process opens for those protocols (fsspec's own config, which its environment
    variables also fill). Filesystems cached with other options are dropped.

    ``replace``: a protocol that an earlier call set and ``options`` does not name gets back
    what it had before (what a worker of a long-lived cluster does when the next run, with
    other options or none, registers its setup)."""
    if replace:
        for protocol in [p for p in _SET if p not in options]:
            before = _SET.pop(protocol)
            if before is None:
                fsspec.config.conf.pop(protocol, None)
            else:
                fsspec.config.conf[protocol] = before
            _forget_instances(protocol)
    _redact.remember(options)
    for protocol, opts in options.items():
        if fsspec.config.conf.get(protocol) != dict(opts):
            _SET.setdefault(protocol, fsspec.config.conf.get(protocol))
            fsspec.config.conf[protocol] = dict(opts)
            _forget_instances(protocol)


# Credentials that reach fsspec's config from its environment variables or files.
_redact.remember(fsspec.config.conf)


def _forget_instances(protocol: str) -> None:
    # A protocol whose package is missing is reported where a URL uses it.
    with contextlib.suppress(ImportError, ValueError):
        fsspec.get_filesystem_class(protocol).clear_instance_cache()


def _missing_package(url: str, protocol: str, cause: BaseException) -> StorageError:
    package, extra = EXTRAS.get(protocol, (None, None))
    if package is None:
        how = f"install the fsspec package for {protocol}:// ({first_line(cause)})"
    elif extra is None:
        how = f"pip install {package}"
    else:
        how = f"pip install 'daskhps[{extra}]' (or pip install {package})"
    return StorageError(
        f"{shown(url)}: reading {protocol}:// URLs needs the {package or 'a'} "
        f"package, which is not installed: {how}"
    )


def filesystem(url: str) -> tuple[AbstractFileSystem, str]:
    """The filesystem of ``url`` and the path on it; a protocol nobody knows or whose package
    is not installed is a :class:`StorageError` saying which package to install."""
    protocol = protocol_of(url) or "file"
    try:
        fsspec.get_filesystem_class(protocol)
    except ImportError as e:
        raise _missing_package(url, protocol, e) from None
    except ValueError:
        raise StorageError(
            f"{shown(url)}: {protocol}:// is no protocol fsspec knows; check the URL"
        ) from None
    try:
        return url_to_fs(url)
    except ImportError as e:
        raise _missing_package(url, protocol, e) from None
    except Exception as e:  # an option the package refuses, a malformed URL
        raise failure(url, e, "open") from None


def _has_buckets(fs: AbstractFileSystem) -> bool:
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    return any(p in _BUCKETS for p in protocols)


def make_folder(fs: AbstractFileSystem, path: str) -> None:
    """Make the folder ``path`` (and its parents) where the store has folders. An object
    store has none (a key is written whole), and its ``makedirs`` creates the bucket: a
    bucket is the user's to create (its region, its permissions, its bill), never daskhps's,
    so there nothing is made and a write to a bucket that does not exist fails."""
    if not _has_buckets(fs):
        fs.makedirs(path, exist_ok=True)


def bucket_of(url: str) -> str | None:
    """The bucket (container) a URL of an object store names, None for other protocols."""
    protocol = protocol_of(url)
    if protocol not in _BUCKETS:
        return None
    return url.split("://", 1)[1].split("/", 1)[0] or None


_CONNECT = (
    "could not connect",
    "connect timeout",
    "connection refused",
    "cannot connect",
    "name or service not known",
    "nodename nor servname",
    "temporary failure in name resolution",
    "connection reset",
    "connection aborted",
)
_DENIED = (
    "accessdenied",
    "access denied",
    "invalidaccesskeyid",
    "signaturedoesnotmatch",
    "forbidden",
    "not authorized",
    "unauthorized",
    "security token",
    "expiredtoken",
    "access key id",
    "signature we calculated",
)
_NO_CREDENTIALS = ("unable to locate credentials", "nocredentials", "no credentials")


def failure(url: str, exc: BaseException, doing: str = "read") -> StorageError:
    """One line for a store's failure at ``url`` while ``doing`` (``list``, ``read``,
    ``write``): the URL, then :func:`reason`. The cause stays attached (``__cause__``),
    never printed by the command line."""
    if isinstance(exc, StorageError):
        return exc
    err = StorageError(f"{shown(url)}: {reason(url, exc, doing)}")
    err.__cause__ = exc
    return err


def reason(url: str, exc: BaseException, doing: str = "read") -> str:
    """What the store said of ``url`` while ``doing``, in the words of what would fix it."""
    text = first_line(exc)
    low = f"{type(exc).__name__} {text}".lower()
    bucket = bucket_of(url)
    if any(w in low for w in _NO_CREDENTIALS):
        why = (
            "no credentials were found: give them in storage.options, the environment "
            "(AWS_ACCESS_KEY_ID, ...) or the package's config file"
        )
    elif isinstance(exc, PermissionError) or any(w in low for w in _DENIED):
        why = (
            f"access denied ({text}): check the credentials in storage.options, the "
            "environment or the package's config file, and that they may "
            f"{'list' if doing == 'list' else doing} here"
        )
    elif isinstance(exc, ConnectionError) or any(w in low for w in _CONNECT):
        endpoint = _endpoint(protocol_of(url))
        why = (
            f"cannot connect to the store's endpoint{f' {endpoint}' if endpoint else ''}: "
            "check the URL and the endpoint (storage.options' endpoint_url, "
            "AWS_ENDPOINT_URL), and that the server is up"
        )
    elif no_such_bucket(url, exc):
        why = _NO_BUCKET.format(bucket=bucket)
    elif isinstance(exc, FileNotFoundError) or getattr(exc, "errno", None) == errno.ENOENT:
        why = (
            "the object is gone: it was listed when the run was planned but not there when "
            "read (deleted or rewritten since); restore it, or start again to plan without it"
            if doing == "read"
            else "no such object"
        )
    else:
        why = f"cannot {doing} it ({type(exc).__name__}: {text})"
    return why


_NO_BUCKET = "the bucket {bucket!r} does not exist: check the URL"


def no_such_bucket(url: str, exc: BaseException) -> bool:
    """Whether ``exc`` says that the bucket (container) of ``url`` does not exist."""
    low = f"{type(exc).__name__} {first_line(exc)}".lower()
    return (
        bucket_of(url) is not None
        and ("bucket" in low or "container" in low)
        and ("not exist" in low or "nosuchbucket" in low or "not found" in low)
    )


def check_bucket(url: str) -> None:
    """Raise the one line for a URL whose bucket does not exist: listing such a URL finds
    nothing rather than failing, so a caller that found nothing asks this before saying so."""
    bucket = bucket_of(url)
    if bucket is None:
        return
    fs, _ = filesystem(url)
    try:
        there = fs.exists(bucket)
    except Exception as e:
        raise failure(url, e, "list") from None
    if not there:
        raise StorageError(f"{shown(url)}: {_NO_BUCKET.format(bucket=bucket)}")


def _endpoint(protocol: str | None) -> str | None:
    """The endpoint a protocol's requests go to where one was set (no credentials in it)."""
    opts = fsspec.config.conf.get(protocol or "", {})
    url = opts.get("endpoint_url") or (opts.get("client_kwargs") or {}).get("endpoint_url")
    if url is None and protocol in ("s3", "s3a"):
        url = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    return shown(str(url)) if url else None


def _is_transport(exc: BaseException) -> bool:
    """Whether ``exc`` is the store failing (rather than bytes that do not parse)."""
    if isinstance(exc, (FileNotFoundError, PermissionError, ConnectionError, TimeoutError)):
        return True
    module = type(exc).__module__ or ""
    return module.startswith(("botocore", "aiobotocore", "aiohttp", "google", "azure"))


def transport_failure(url: str, exc: BaseException) -> StorageError | None:
    """A :class:`StorageError` when reading the URL ``url`` failed in the store itself, None
    for a local path or bytes that were read but do not parse (bad rows)."""
    if not is_url(url) or not _is_transport(exc):
        return None
    return failure(url, exc, "read")


@contextmanager
def open_input(path: str) -> Iterator[IO[bytes]]:
    """``path`` opened for reading bytes: a local file, or an object read in blocks (fsspec's
    read-ahead buffer: memory stays bounded by the block, not the object)."""
    if not is_url(path):
        with open(local_path(path), "rb") as f:
            yield f
        return
    fs, p = filesystem(path)
    with fs.open(p, "rb") as f:
        yield f


def exists(path: str) -> bool:
    """Whether a file, folder or object is at ``path``; a store that cannot answer is a
    :class:`StorageError`."""
    if not is_url(path):
        return os.path.exists(local_path(path))
    fs, p = filesystem(path)
    try:
        return bool(fs.exists(p))
    except Exception as e:
        raise failure(path, e, "list") from None


def folder_of(path: str) -> str:
    """The folder (prefix) holding a file or an object."""
    return path.rsplit("/", 1)[0] if is_url(path) else os.path.dirname(path)


def file_size(path: str) -> int:
    """Bytes of ``path``; 0 when it is not there (reading it reports that)."""
    if not is_url(path):
        p = local_path(path)
        return os.path.getsize(p) if os.path.exists(p) else 0
    fs, p = filesystem(path)
    try:
        return int(fs.size(p) or 0)
    except FileNotFoundError:
        return 0


def stamp(path: str) -> tuple[Any, ...]:
    """What changes when ``path`` is rewritten: size and modification time of a file, size
    and ETag (or modification time) of an object; ``(-1, -1)`` when it is not there."""
    if not is_url(path):
        try:
            st = os.stat(local_path(path))
        except OSError:
            return (-1, -1)
        return (st.st_size, st.st_mtime_ns)
    fs, p = filesystem(path)
    try:
        info = fs.info(p)
    except OSError:
        return (-1, -1)
    version = info.get("ETag") or info.get("etag") or info.get("md5Hash") or info.get("mtime")
    return (info.get("size"), str(version or info.get("LastModified", "")))
