"""A version number that wakes waiting agents when orders may have changed.

Agents heartbeat every second, but waiting up to a second for a start or a stop would make a
crash take a second longer to stop the other nodes. So each agent also keeps one long poll
open (`GET /api/agents/changes?since=V`): a start, a stop or an attempt's end bumps the
version, every poll returns at once, and each agent heartbeats immediately to get its orders.
Bumps come from any thread; the waiters live on the server's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib


class Changes:
    def __init__(self) -> None:
        self.version = 0
        self.loop: asyncio.AbstractEventLoop | None = None
        self.event: asyncio.Event | None = None
        self.closed = False

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Called once the server's event loop runs (without it, bumps only count)."""
        self.loop, self.event = loop, asyncio.Event()

    def bump(self) -> None:
        self.version += 1
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._wake)

    def close(self) -> None:
        """The server is shutting down: answer every open poll now and every later one at once
        (a poll held open would make the shutdown cancel it, with an error)."""
        self.closed = True
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        event, self.event = self.event, asyncio.Event()
        assert event is not None  # for type checkers: bound before the loop could call this
        event.set()  # waiters hold the old event; new waiters get the new one

    async def wait(self, since: int, timeout: float) -> int:
        if self.version != since or self.event is None or self.closed:
            return self.version
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.event.wait(), timeout)
        return self.version
