"""Two JSON pages of the scheduler's dashboard that Dask itself breaks, answered correctly.

Both fail in a plain ``LocalCluster`` (distributed 2026.8, bokeh 3.9), daskhps or not:

* ``/json/identity.json`` writes ``Scheduler.identity()``, whose workers' ``metrics`` hold
  the Fine Performance Metrics of the last heartbeat (``digests_total_since_heartbeat``),
  keyed by tuples such as ``("execute", "train", "thread-cpu", "seconds")``. ``json.dumps``
  refuses tuple keys, so while tasks run (always, during training) the page is an HTTP 500
  and tornado prints ``TypeError: keys must be str ... not tuple`` into the driver's terminal,
  where the embedded scheduler runs.
* ``/sitemap.json`` walks the routes and reads ``target_kwargs["path"]`` of every
  ``StaticFileHandler``; bokeh's static handlers subclass it without one: ``KeyError``.

:func:`repair_dashboard` swaps the two handlers, on the scheduler's event loop, for ones that
write the same answer in valid JSON: a tuple key becomes its parts joined by ``/``
(``"execute/train/thread-cpu/seconds"``), and a static route without a folder is listed by
its prefix.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from typing import Any

import tornado.routing
import tornado.web
from distributed.http.routing import DirectoryHandler
from distributed.http.scheduler.json import IdentityJSON

__all__ = ["json_safe", "repair_dashboard"]

log = logging.getLogger(__name__)


def json_safe(value: Any) -> Any:
    """``value`` with every mapping key JSON can hold: tuples joined by ``/``, others by
    ``str``; other values pass (``default=str`` catches what ``json`` cannot write)."""
    if isinstance(value, dict):
        return {_key(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def _key(k: Any) -> str | int | float | bool | None:
    if k is None or isinstance(k, str | int | float | bool):
        return k
    if isinstance(k, tuple):
        return "/".join(str(part) for part in k)
    return str(k)


def _write_json(handler: tornado.web.RequestHandler, value: Any) -> None:
    handler.set_header("Content-Type", "application/json; charset=UTF-8")
    handler.write(json.dumps(json_safe(value), default=str))


class SafeIdentityJSON(IdentityJSON):
    def get(self) -> None:
        _write_json(self, self.server.identity())


class SafeDirectoryHandler(DirectoryHandler):
    def get(self) -> None:
        out: set[str] = set()
        routers: set[Any] = set()
        for app in [*getattr(self.application, "applications", []), self.application]:
            if "bokeh" in str(app):
                out.update(app.app_paths)
            else:
                _descend(app.default_router, routers, out)
                _descend(app.wildcard_router, routers, out)
        _write_json(self, {"paths": sorted(out)})


def _descend(router: Any, routers: set[Any], out: set[str]) -> None:
    """distributed.http.routing._descend_routes, minus its ``KeyError`` on static handlers
    that serve no single folder."""
    if router in routers:
        return
    routers.add(router)
    for rule in [*router.named_rules.values(), *router.rules]:
        if isinstance(rule.matcher, tornado.routing.PathMatches):
            pattern = rule.matcher.regex.pattern
            folder = rule.target_kwargs.get("path")
            static = isinstance(rule.target, type) and issubclass(
                rule.target, tornado.web.StaticFileHandler
            )
            if static and folder:
                prefix = pattern.rstrip("(.*)$").rstrip("/")
                for d, _, files in os.walk(folder):
                    for fn in files:
                        out.add(f"{d}/{fn}".replace(folder, prefix).replace("\\", "/"))
            else:
                out.add(pattern.rstrip("$"))
        if isinstance(rule.target, tornado.routing.RuleRouter):
            _descend(rule.target, routers, out)


_REPLACEMENTS = {IdentityJSON: SafeIdentityJSON, DirectoryHandler: SafeDirectoryHandler}


def _rules(router: Any, seen: set[int]) -> Iterator[Any]:
    if id(router) in seen:
        return
    seen.add(id(router))
    for rule in [*router.named_rules.values(), *router.rules]:
        yield rule
        if isinstance(rule.target, tornado.routing.RuleRouter):
            yield from _rules(rule.target, seen)


def _repair(dask_scheduler: Any = None) -> int:
    """Swap the handlers in the scheduler's HTTP application; how many routes were swapped."""
    app = getattr(dask_scheduler, "http_application", None)
    if app is None:
        return 0
    seen: set[int] = set()
    swapped = 0
    for top in [*getattr(app, "applications", []), app]:
        for router in (top.default_router, top.wildcard_router):
            for rule in _rules(router, seen):
                new = _REPLACEMENTS.get(rule.target)
                if new is not None:
                    rule.target = new
                    swapped += 1
    return swapped


def repair_dashboard(client: Any) -> None:
    """Repair the JSON pages of the scheduler of ``client`` (one daskhps started: the
    scheduler must import daskhps). A failure is logged, never raised: the run does not
    need its dashboard."""
    try:
        swapped = client.run_on_scheduler(_repair)
    except Exception as e:
        log.debug("could not repair the dashboard's JSON pages: %s", e)
        return
    log.debug("dashboard: %d JSON routes answered by daskhps's handlers", swapped)
