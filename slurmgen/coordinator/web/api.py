"""The page calls the coordinator's own JSON API, in process, with the server's token.

One path for every change (the same validation, the same 409s and the same messages as the
CLI), and no second reader of the store: the page is just another API client, one that
happens to run inside the server.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx
from starlette.applications import Starlette


@dataclass
class Reply:
    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


def server_token(app: Starlette) -> str:
    return app.state.token


async def call(app: Starlette, method: str, path: str, *, json: Any = None, params: dict | None = None) -> Reply:
    transport = httpx.ASGITransport(app=app)
    headers = {"Authorization": f"Bearer {server_token(app)}"}
    async with httpx.AsyncClient(transport=transport, base_url="http://coordinator") as client:
        response = await client.request(method, path, json=json, params=params, headers=headers)
    try:
        body = response.json()
    except ValueError:
        body = {"detail": response.text}
    return Reply(response.status_code, body, dict(response.headers))


async def get(app: Starlette, path: str, **params: Any) -> Any:
    """The body of a GET that must succeed (a failure here is the server's bug, not the user's)."""
    reply = await call(app, "GET", path, params={k: v for k, v in params.items() if v is not None})
    if not reply.ok:
        raise RuntimeError(f"GET {path}: HTTP {reply.status}: {reply.body}")
    return reply.body
