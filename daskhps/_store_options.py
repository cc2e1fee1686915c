"""What a filesystem's storage options may be, and the defaults daskhps gives where the
user gave none (:mod:`daskhps.storage` opens every filesystem through :func:`url_to_fs`)."""

from __future__ import annotations

import functools
import importlib
import inspect
import os
from typing import Any

import fsspec
from fsspec.dircache import DirCache
from fsspec.spec import AbstractFileSystem

__all__ = ["option_names", "url_to_fs"]


def url_to_fs(url: str) -> tuple[AbstractFileSystem, str]:
    """fsspec's ``url_to_fs``, with daskhps's defaults (:data:`_DEFAULTS`) for what the
    options in effect leave unset; raises what fsspec raises."""
    protocol = fsspec.core.split_protocol(url)[0] or "file"
    try:
        cls = fsspec.get_filesystem_class(protocol)
    except (ImportError, ValueError):
        return fsspec.core.url_to_fs(url)  # fsspec's own error, as callers expect it
    return fsspec.core.url_to_fs(url, **_defaults(cls))


# Where the user set no retries: botocore's own (5 attempts, with up to 15 s of backoff in
# each call) make an endpoint that refuses connections 25 s or more of silence before its
# one line. Two attempts (at most 1 s of backoff) still ride out a dropped connection, and
# s3fs retries throttling and broken reads itself, whatever botocore does.
_S3_RETRIES = {"total_max_attempts": 2, "mode": "standard"}
_DEFAULTS = {"s3fs.core.S3FileSystem": {"config_kwargs": {"retries": _S3_RETRIES}}}
_BOTO_RETRY_SETTINGS = ("AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE")


def _defaults(cls: type) -> dict[str, Any]:
    """The options to pass ``cls`` beyond fsspec's config: daskhps's defaults for what
    neither that config (``storage.options``, ``FSSPEC_*``) nor the package's own settings
    set. Only whole options are passed, so a user's ``config_kwargs`` keep all they hold."""
    want = _DEFAULTS.get(f"{cls.__module__}.{cls.__qualname__}")
    if want is None:
        return {}
    given = fsspec.config.apply_config(cls, {})
    config_kwargs = dict(given.get("config_kwargs") or {})
    if "retries" in config_kwargs or _boto_sets_retries(given.get("profile")):
        return {}
    return {"config_kwargs": {**config_kwargs, **want["config_kwargs"]}}


def _boto_sets_retries(profile: str | None) -> bool:
    """Whether the environment or the AWS config file sets botocore's retries."""
    if any(os.environ.get(v) for v in _BOTO_RETRY_SETTINGS):
        return True
    return _config_file_sets_retries(
        os.environ.get("AWS_CONFIG_FILE"), profile or os.environ.get("AWS_PROFILE")
    )


@functools.cache
def _config_file_sets_retries(config_file: str | None, profile: str | None) -> bool:
    # botocore finds the file itself (AWS_CONFIG_FILE): the name only keys the cache.
    try:
        import botocore.session

        scoped = botocore.session.Session(profile=profile).get_scoped_config()
    except Exception:  # no botocore, no such profile: s3fs says so where it is used
        return False
    return "max_attempts" in scoped or "retry_mode" in scoped


# Filesystems whose options past their own named ones go elsewhere than fsspec's base class
# (which ignores what it does not know), with where: s3fs hands them to aiobotocore's session,
# which refuses any it does not know; None: to something that takes any option (HTTP's to
# every request, SFTP's to paramiko's connect), so no name can be refused.
_REST_GOES_TO: dict[str, tuple[str, str] | None] = {
    "s3fs.core.S3FileSystem": ("aiobotocore.session", "AioSession"),
    "fsspec.implementations.http.HTTPFileSystem": None,
    "fsspec.implementations.http_sync.HTTPFileSystem": None,
    "fsspec.implementations.sftp.SFTPFileSystem": None,
}


def option_names(protocol: str) -> frozenset[str] | None:
    """The storage options ``protocol``'s filesystem takes: the named parameters of its
    class's ``__init__`` and of the classes it passes the rest on to, and those of fsspec's
    base. None where any name may be right, fsspec does not know the protocol or its
    package is not installed (a URL that uses it says so)."""
    try:
        cls = fsspec.get_filesystem_class(protocol)
    except (ImportError, ValueError):
        return None
    return _option_names(cls)


@functools.cache
def _option_names(cls: type) -> frozenset[str] | None:
    name = f"{cls.__module__}.{cls.__qualname__}"
    if name in _REST_GOES_TO and _REST_GOES_TO[name] is None:
        return None
    rest = _REST_GOES_TO.get(name)
    targets: list[Any] = list(cls.__mro__)
    if rest is not None:
        try:
            targets = [cls, getattr(importlib.import_module(rest[0]), rest[1])]
        except (ImportError, AttributeError):
            return None
    # fsspec's base takes these whatever the class: the listing cache's (passed on by s3fs
    # too) and the instance cache's.
    names = {"skip_instance_cache", *_named(DirCache.__init__)}
    names.update(getattr(cls, "_strip_tokenize_options", ()))
    for target in targets:
        init = target.__dict__.get("__init__")
        if init is None:
            continue
        names.update(_named(init))
        if not _takes_more(init):  # the chain stops: a parent's names are not reachable
            break
    return frozenset(names)


def _named(function: Any) -> list[str]:
    try:
        params = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in params if p.kind in kinds and p.name != "self"]


def _takes_more(function: Any) -> bool:
    try:
        params = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params)
