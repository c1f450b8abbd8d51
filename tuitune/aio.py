"""asyncio helpers shared by the core (no UI)."""

from __future__ import annotations

import asyncio


async def cancel_and_wait(*tasks: asyncio.Future | None, ignore: tuple[type[BaseException], ...] = (Exception,)) -> None:
    """Cancel ``tasks`` and wait until each has ended, however it ended (its own CancelledError
    and ``ignore`` are dropped). A cancel of the caller meanwhile (Ctrl-C during a relaunch's
    clean-up) is not swallowed with the child's: it is raised as soon as it arrives."""
    live = [t for t in tasks if t is not None]
    for t in live:
        t.cancel()
    for t in live:
        try:
            await t
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if me is not None and me.cancelling():
                raise
        except ignore:
            pass
