"""The cluster's workers as the scheduler sees them now.

``Client.scheduler_info(n_workers=-1)`` returns the client's cached identity after refreshing
it, and the client also refreshes that cache in the background with ``n_workers=0`` (totals
only, an empty ``"workers"``). A background refresh that lands between the call's own refresh
and its return makes every worker look gone. Asking the scheduler directly has no such race.
"""

from __future__ import annotations

from typing import Any

__all__ = ["scheduler_workers"]


def scheduler_workers(client: Any) -> dict[str, dict[str, Any]]:
    """``{address: worker info}`` of every worker, fetched from the scheduler on this call."""
    identity = client.sync(client.scheduler.identity, n_workers=-1)
    return dict(identity.get("workers", {}))
