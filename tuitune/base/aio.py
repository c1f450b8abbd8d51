"""asyncio helpers shared by the core (no UI)."""

from __future__ import annotations

import asyncio


async def cancel_and_wait(
    *tasks: asyncio.Future | None, ignore: tuple[type[BaseException], ...] = (Exception,)
) -> None:
    """Cancel ``tasks`` and wait until every one has ended, however it ended (its own cancel and
    ``ignore`` are dropped; anything else is raised). A cancel of the caller that arrives meanwhile
    (Ctrl-C during a relaunch's clean-up) is not swallowed: it is raised once the children have
    ended. One that was already under way when we were called (clean-up in a ``finally`` after
    Ctrl-C) does not cut the clean-up short."""
    live = [t for t in tasks if t is not None]
    me = asyncio.current_task()
    before = me.cancelling() if me is not None else 0
    for t in live:
        t.cancel()
    pending, interrupted = set(live), False
    while pending:
        try:
            _, pending = await asyncio.wait(pending)  # unlike `await t`, passes no cancel on to t
        except asyncio.CancelledError:
            interrupted = True
    for t in live:
        exc = None if t.cancelled() else t.exception()
        if exc is not None and not isinstance(exc, ignore):
            raise exc
    if interrupted or (me is not None and me.cancelling() > before):
        raise asyncio.CancelledError
