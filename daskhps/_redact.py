"""Credentials kept out of every log line, at every verbosity.

Object-store clients log what they send: at ``-vv`` botocore's debug lines carry the signed
headers (``Credential=<access key id>/...``, ``X-Amz-Security-Token``), and an exception's
text may quote an option's value. :class:`Redactor` is a logging filter that rewrites each
record before any handler formats it: the values of credential-like storage options
(:func:`remember`, fed by :func:`daskhps.storage.use_options`), the credential variables of
the environment, and credentials written in the known places of a signed request or URL all
become ``***``.

A filter on a logger is skipped by the records its child loggers propagate, so the filter
sits on handlers: :func:`install` puts it on every handler this process has (and on
logging's last-resort handler, which prints for a process that configured none). The command
line installs it once it set up logging, the driver again once Dask's handlers exist, and
every Dask worker in its setup.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote

__all__ = ["MASK", "Redactor", "install", "remember", "scrub"]

MASK = "***"

# Option names whose values are credentials in fsspec's packages: s3fs (key, secret, token,
# username and password as their aliases), gcsfs (token), adlfs (account_key, sas_token,
# connection_string, credential, client_secret), botocore's own client arguments, and the
# user:password pairs of ftp, sftp, webdav and the like.
_SECRET_NAME = re.compile(
    r"(^|_)(key|secret|token|password|passwd|pwd|username|credentials?|sas|signature"
    r"|connection_string|private_key|key_id)($|_)",
    re.IGNORECASE,
)
# gcsfs's token modes name where to find the credentials, not the credentials.
_NOT_SECRET = frozenset({"anon", "browser", "cache", "cloud", "google_default", "true", "false"})
_SHORTEST = 4  # a shorter value would mask unrelated text and protects nothing

_ENVIRONMENT = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AZURE_STORAGE_KEY",
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_STORAGE_SAS_TOKEN",
    "AZURE_STORAGE_CONNECTION_STRING",
    "AZURE_CLIENT_SECRET",
)

# Credentials by where they stand, whatever their value: the access key id of a signed
# request (SigV4's Credential=<id>/ in a header or a presigned URL, SigV2's AWSAccessKeyId=),
# signatures, session tokens, Authorization values, Azure's AccountKey= and sig=, and
# user:password@ in a URL (both: s3fs reads the user as the access key id).
_PLACES = re.compile(
    r"(?P<k>(?:X-Amz-)?Credential=|AWSAccessKeyId=)[^/%,&\s'\"]+"
    r"|(?P<s>(?:X-Amz-)?Signature=)[^,&\s'\"]+"
    r"|(?P<t>Security-Token['\"]?\s*[:=]\s*b?['\"]?)[^'\"&,\s]+"
    r"|(?P<a>Authorization['\"]?\s*[:=]\s*b?['\"]?(?:Basic|Bearer|SharedKey)\s+)[^'\"\s]+"
    r"|(?P<z>AccountKey=|SharedAccessSignature=|[?&]sig=)[^;&\s'\"]+"
    r"|(?P<u>://)[^/@\s:'\"]*:[^/@\s'\"]+(?=@)",
    re.IGNORECASE,
)

_lock = threading.Lock()
_remembered: set[str] = set()
_state: dict[str, Any] = {"key": None, "values": None}


def _keep(value: Any, into: set[str]) -> None:
    """Every string under ``value`` (a credential given as a mapping: a service account's
    JSON) into ``into``."""
    if isinstance(value, Mapping):
        for v in value.values():
            _keep(v, into)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _keep(v, into)
    elif isinstance(value, (str, bytes)):
        text = value.decode(errors="replace") if isinstance(value, bytes) else value
        if len(text) >= _SHORTEST and text.lower() not in _NOT_SECRET:
            into.add(text)


def secrets_in(options: Mapping[str, Any]) -> set[str]:
    """The values of credential-like names anywhere in ``options`` (nested mappings too:
    ``client_kwargs: {aws_secret_access_key: ...}``)."""
    found: set[str] = set()
    for name, value in options.items():
        if isinstance(name, str) and _SECRET_NAME.search(name):
            _keep(value, found)
        elif isinstance(value, Mapping):
            found |= secrets_in(value)
    return found


def remember(options: Mapping[str, Any]) -> None:
    """Mask from now on the credentials in ``options`` (storage options, per protocol or
    not). A value once remembered stays masked for the life of the process."""
    found = secrets_in(options)
    if found - _remembered:
        with _lock:
            _remembered.update(found)
            _state["key"] = None


def _values() -> re.Pattern[str] | None:
    """The pattern of every known credential value, rebuilt only when the environment's
    credentials or the remembered values changed."""
    env = tuple(map(os.environ.get, _ENVIRONMENT))
    key = (env, len(_remembered))
    if _state["key"] == key:
        return _state["values"]
    with _lock:
        values = {v for v in env if v and len(v) >= _SHORTEST} | _remembered
        # Also as a URL carries them (a secret's "/" and "+" are escaped in a query).
        values |= {quote(v, safe="") for v in values}
        longest_first = sorted(values, key=len, reverse=True)
        pattern = re.compile("|".join(map(re.escape, longest_first))) if values else None
        _state["values"], _state["key"] = pattern, key
    return pattern


def _place(m: re.Match[str]) -> str:
    return next(g for g in m.groups() if g is not None) + MASK


def scrub(text: str) -> str:
    """``text`` with every credential it holds masked."""
    values = _values()
    if values is not None:
        text = values.sub(MASK, text)
    return _PLACES.sub(_place, text)


class Redactor(logging.Filter):
    """Masks the credentials of a record's message, exception and stack text; drops
    nothing."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: the handler reports it as it would
            return True
        clean = scrub(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = scrub(record.exc_text)
        if record.stack_info:
            record.stack_info = scrub(record.stack_info)
        return True


_FILTER = Redactor()


def _handlers() -> Iterable[logging.Handler]:
    yield from logging.getLogger().handlers
    for logger in list(logging.Logger.manager.loggerDict.values()):
        if isinstance(logger, logging.Logger):
            yield from logger.handlers
    if logging.lastResort is not None:
        yield logging.lastResort


def install() -> None:
    """Put the :class:`Redactor` on every handler of this process (once each); a handler
    added later needs another call."""
    for handler in _handlers():
        if _FILTER not in handler.filters:
            handler.addFilter(_FILTER)
