"""Jump hosts shared by every target behind them. No paramiko here.

Behind one bastion, 32 targets must not mean 32 SSH sessions on it: OpenSSH's default
`MaxStartups 10:30:100` starts refusing handshakes once 10 are pending. So the first target
that needs a jump host connects to it, the others wait for that connection and reuse it (one
transport, a `direct-tcpip` channel per target, as `ssh -J` with ControlMaster would), and a
failure to reach the jump host is reported once and given to every target behind it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Generic, Protocol, TypeVar


class Shareable(Protocol):
    def share(self) -> Shareable: ...


C = TypeVar("C", bound=Shareable)


class _Slot(Generic[C]):
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.conn: C | None = None
        self.error: BaseException | None = None


class JumpPool(Generic[C]):
    """One connection per jump host (keyed by how it is reached), made once, shared by all."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._slots: dict[Hashable, _Slot[C]] = {}

    def get(self, key: Hashable, make: Callable[[], C]) -> C:
        """The shared connection for `key` (made by `make` the first time), one more holder
        counted on it; or the error making it raised, for every caller."""
        with self._lock:
            slot = self._slots.setdefault(key, _Slot())
        with slot.lock:
            if slot.error is not None:
                raise slot.error
            if slot.conn is None:
                try:
                    slot.conn = make()
                except Exception as exc:
                    slot.error = exc
                    raise
                return slot.conn  # the maker is its first holder
            return slot.conn.share()  # type: ignore[return-value]
