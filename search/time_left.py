"""About how long a search session has left, as the live summary and ``status`` say it.

Read by ``status`` too, so nothing heavy is imported here.
"""

from __future__ import annotations

# Trials a session ends before it estimates the time left: the first ones carry the start-up.
ENDED_BEFORE_AN_ESTIMATE = 2


def time_left(elapsed_s: float, ended: int, ended_before: int, limit: int, time_budget_s: float | None) -> str:
    """`` (about 2m 30s left)`` or `` (time budget ends in 20s)``, or "" when there is no
    telling: the trials left (``limit`` less ``ended``) at the pace the session has ended
    trials in ``elapsed_s`` (those ended before it began, ``ended_before``, not counted),
    once it has ended a few; or what is left of its time budget, if that ends first."""
    ended_here = ended - ended_before
    estimate = (limit - ended) * elapsed_s / ended_here \
        if ended_here >= ENDED_BEFORE_AN_ESTIMATE and ended < limit else None
    if time_budget_s is not None and ended < limit:
        budget_left = max(0.0, time_budget_s - elapsed_s)
        if estimate is None or budget_left < estimate:
            return f" (time budget ends in {duration(budget_left)})"
    return f" (about {duration(estimate)} left)" if estimate is not None else ""


def duration(seconds: float) -> str:
    """``45s``, ``3m 05s``, ``2h 07m``: a time left as a person reads it, to the precision an estimate has."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"
