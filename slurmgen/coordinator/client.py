"""The coordinator's HTTP client (httpx), used by the CLI and the agents.

Each method is one API call returning the shared pydantic models; every failure is a
`ClientError` (a `SlurmgenError` carrying the HTTP status) with one line a person can act on:
the server's own message for 404/409, each bad field for 422, and what to check when the
server cannot be reached.
"""

from __future__ import annotations

from typing import Any

import httpx

from slurmgen.contract import exitcodes, ports
from slurmgen.coordinator.models import (
    AgentLines,
    AgentOrders,
    AgentReport,
    GroupConfig,
    GroupDetail,
    GroupOut,
    LogLine,
    RankOut,
    WorkerOut,
)
from slurmgen.errors import SlurmgenError

DEFAULT_SERVER = f"http://127.0.0.1:{ports.COORDINATOR_PORT}"


class ClientError(SlurmgenError):
    def __init__(self, message: str, status: int | None = None, hint: str | None = None):
        code = exitcodes.BAD_INPUT if status in (401, 404, 409, 422) else exitcodes.FAILED
        super().__init__(message, hint=hint, exit_code=code)
        self.status = status


def _problem(response: httpx.Response) -> str:
    try:
        detail = response.json().get("detail")
    except ValueError:
        detail = response.text[:200]
    if isinstance(detail, list):  # pydantic's 422: name each field and its value
        return "; ".join(
            f"{'.'.join(str(p) for p in d.get('loc', [])[1:]) or 'body'}: {d.get('msg')} (got {d.get('input')!r})"
            for d in detail
        )
    return str(detail)


class Client:
    def __init__(self, base_url: str, token: str, timeout: float = 10.0):
        self.base_url, self.token, self.timeout = base_url.rstrip("/"), token, timeout
        self.http = httpx.Client(base_url=self.base_url, timeout=timeout, headers={"Authorization": f"Bearer {token}"})

    def close(self) -> None:
        self.http.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as e:
            raise ClientError(
                f"server: cannot reach {self.base_url}: {e}",
                hint="is `slurmgen serve` running there? (--server or $SLURMGEN_SERVER)",
            ) from None
        if response.status_code == 401:
            raise ClientError(
                f"server: {self.base_url} refused the token",
                401,
                hint="use the token file the server wrote (--token-file or $SLURMGEN_TOKEN)",
            )
        if response.status_code >= 400:
            raise ClientError(_problem(response), response.status_code)
        return response.json() if response.content else None

    def workers(self) -> list[WorkerOut]:
        return [WorkerOut(**w) for w in self._call("GET", "/api/workers")]

    def move(self, workers: list[str], group: str | None) -> list[WorkerOut]:
        return [
            WorkerOut(**w) for w in self._call("POST", "/api/workers/move", json={"workers": workers, "group": group})
        ]

    def groups(self) -> list[GroupOut]:
        return [GroupOut(**g) for g in self._call("GET", "/api/groups")]

    def create_group(self, name: str) -> GroupOut:
        return GroupOut(**self._call("POST", "/api/groups", json={"name": name}))

    def delete_group(self, name: str) -> None:
        self._call("DELETE", f"/api/groups/{name}")

    def group(self, name: str) -> GroupDetail:
        return GroupDetail(**self._call("GET", f"/api/groups/{name}"))

    def configure(self, name: str, config: dict) -> GroupOut:
        """Replace the whole config (PUT: a field left out takes its default)."""
        return GroupOut(**self._call("PUT", f"/api/groups/{name}/config", json=config))

    def update_config(self, name: str, changes: dict) -> GroupOut:
        """Change only the fields in `changes` (PATCH), in one transaction on the server."""
        return GroupOut(**self._call("PATCH", f"/api/groups/{name}/config", json=changes))

    def ranks(self, name: str) -> list[RankOut]:
        return [RankOut(**r) for r in self._call("GET", f"/api/groups/{name}/ranks")]

    def start(self, name: str) -> GroupOut:
        return GroupOut(**self._call("POST", f"/api/groups/{name}/start"))

    def stop(self, name: str) -> GroupOut:
        return GroupOut(**self._call("POST", f"/api/groups/{name}/stop"))

    def logs(
        self,
        name: str,
        rank: int | None = None,
        attempt: int | None = None,
        after: int = 0,
        limit: int = 500,
        tail: bool = False,
    ) -> list[LogLine]:
        params = {
            k: v
            for k, v in {"rank": rank, "attempt": attempt, "after": after, "limit": limit, "tail": tail}.items()
            if v is not None
        }
        return [LogLine(**ln) for ln in self._call("GET", f"/api/groups/{name}/logs", params=params)]

    def changes(self, since: int, timeout: float) -> int:
        """Block until the server's order version differs from `since` (or `timeout`)."""
        return self._call(
            "GET", "/api/agents/changes", params={"since": since, "timeout": timeout}, timeout=timeout + 10
        )["version"]

    def heartbeat(self, report: AgentReport, timeout: float | None = None) -> AgentOrders:
        """Report and get orders; `timeout` (seconds) instead of the client's own, if given."""
        extra = {} if timeout is None else {"timeout": timeout}
        return AgentOrders(
            **self._call(
                "POST",
                "/api/agents/heartbeat",
                content=report.model_dump_json(),
                headers={"Content-Type": "application/json"},
                **extra,
            )
        )

    def lines(self, lines: AgentLines, timeout: float | None = None) -> None:
        """Send output lines between heartbeats; `timeout` (seconds) instead of the client's own."""
        extra = {} if timeout is None else {"timeout": timeout}
        self._call(
            "POST",
            "/api/agents/lines",
            content=lines.model_dump_json(),
            headers={"Content-Type": "application/json"},
            **extra,
        )


__all__ = ["Client", "ClientError", "DEFAULT_SERVER", "GroupConfig"]
