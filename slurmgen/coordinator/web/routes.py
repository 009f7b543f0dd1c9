"""The page's HTML routes: overview, group page, settings form, and the buttons' POSTs.

Every change goes through the JSON API (api.call) and every POST answers with a 303 redirect
to a page (so a reload never repeats it and the address bar never shows a POST's URL); when
the API refused, that page shows the API's message once (kept in the session meanwhile).
Forms work without JavaScript; htmx only adds the live rank-table preview to the settings
form (its POST answers a fragment, not a page).
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response
from pydantic import ValidationError

from slurmgen.contract.backends import BACKENDS
from slurmgen.contract.ports import DEFAULT_MASTER_PORT
from slurmgen.contract.states import ACTIVE_WORDS
from slurmgen.contract.strategies import STRATEGIES
from slurmgen.contract.warm import RESTART_MODES
from slurmgen.coordinator.models import GroupConfig, split_worker_name
from slurmgen.coordinator.ranks import plan_ranks
from slurmgen.errors import SlurmgenError

from . import api, controls, forms, views
from .auth import form_data, form_list, guarded, redirect_with
from .render import flash_notice, render, take_flash

router = APIRouter()
RESTART_WAIT = 30.0  # seconds a restart waits for the stopped attempt to end


async def overview_data(request: Request) -> dict[str, Any]:
    groups, workers = await asyncio.gather(api.get(request.app, "/api/groups"), api.get(request.app, "/api/workers"))
    return views.overview(groups, workers)


async def _overview_page(request: Request) -> Response:
    flash = take_flash(request)
    data = await overview_data(request)
    return render(request, "overview.html", {**data, **flash_notice(flash), "picked": set(flash.get("picked", []))})


def _refused(request: Request, notice: str, picked: list[str] | None = None) -> Response:
    return redirect_with(request, "/ui/", notice=notice, picked=picked or [])


def _refusal(reply: api.Reply) -> str:
    detail = reply.body.get("detail") if isinstance(reply.body, dict) else reply.body
    if isinstance(detail, list):
        return "; ".join(str(e.get("msg", e)).removeprefix("Value error, ") for e in detail)
    return str(detail)


@router.get("/", include_in_schema=False)
async def root() -> Response:
    return RedirectResponse("/ui/", status_code=303)


@router.get("/ui/", name="web_overview")
@guarded("page")
async def overview(request: Request) -> Response:
    return await _overview_page(request)


@router.post("/ui/groups", name="web_create_group")
@guarded("post")
async def create_group(request: Request) -> Response:
    name = (await form_data(request)).get("name", "").strip()
    reply = await api.call(request.app, "POST", "/api/groups", json={"name": name})
    if not reply.ok:
        return _refused(request, f"Could not create group {name!r}: {_refusal(reply)}")
    return RedirectResponse("/ui/", status_code=303)


@router.post("/ui/move", name="web_move")
@guarded("post")
async def move(request: Request) -> Response:
    raw = await request.body()
    workers, target = form_list(raw, "worker"), (await form_data(request)).get("to") or None
    if not workers:
        return _refused(request, "Tick at least one worker to move.")
    reply = await api.call(request.app, "POST", "/api/workers/move", json={"workers": workers, "group": target})
    if not reply.ok:
        return _refused(request, f"Could not move: {_refusal(reply)}", picked=workers)
    return RedirectResponse("/ui/", status_code=303)


async def _wait_inactive(request: Request, name: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + RESTART_WAIT
    while loop.time() < deadline:
        group = await api.get(request.app, f"/api/groups/{name}")
        if group["group"]["state"] not in ACTIVE_WORDS:
            return
        await asyncio.sleep(0.25)


def _no_group(request: Request, name: str) -> Response:
    return _refused(request, f"There is no group {name!r}.")


async def _detail(request: Request, name: str) -> dict[str, Any] | None:
    reply = await api.call(request.app, "GET", f"/api/groups/{name}")
    return reply.body if reply.ok else None


@router.get("/ui/groups/{name}", name="web_group")
@guarded("page")
async def group_page(request: Request, name: str) -> Response:
    detail = await _detail(request, name)
    if detail is None:
        return _no_group(request, name)
    data = await overview_data(request)
    group = next(g for g in data["groups"] if g["name"] == name)
    ranks = await api.call(request.app, "GET", f"/api/groups/{name}/ranks")
    by_worker = {w["name"]: w for w in detail["workers"]}
    preview = {
        "rows": views.rank_rows(ranks.body, by_worker) if ranks.ok else [],
        "error": None if ranks.ok else _refusal(ranks),
        "live": True,
    }
    return render(
        request,
        "group.html",
        {
            "group": group,
            "ranks": preview,
            "shape": data["shape"],
            "attempts": views.attempts_view(detail["attempts"]),
            "settings": controls.config_view(group["config"]),
            "delete_why": controls.delete_refusal(group),
            **flash_notice(take_flash(request)),
        },
    )


def _settings_context(group: dict[str, Any], form: dict[str, str], errors: dict[str, str]) -> dict[str, Any]:
    return {
        "group": group,
        "form": form,
        "errors": errors,
        "nodes": group["nodes"],
        "preview": preview_of(group, form),
        "backends": BACKENDS,
        "strategies": STRATEGIES,
        "restart_modes": RESTART_MODES,
        "default_port": DEFAULT_MASTER_PORT,
    }


def preview_of(group: dict[str, Any], form: dict[str, str]) -> dict[str, Any]:
    """The rank table the form's values would give, by the coordinator's own rule."""
    try:
        body = forms.config_from_form(form, group["nodes"], group["workers"], group["config"])
        rows = plan_ranks(GroupConfig(**body), [split_worker_name(w) for w in group["workers"]])
    except forms.FormErrors as exc:
        return {"rows": [], "error": str(exc)}
    except ValidationError as exc:
        return {"rows": [], "error": "; ".join(forms.errors_from_response(422, {"detail": exc.errors()}).values())}
    except SlurmgenError as exc:
        return {"rows": [], "error": str(exc)}
    return {"rows": views.rank_rows(r.model_dump() for r in rows), "error": None}


async def _group_view(request: Request, name: str) -> dict[str, Any] | None:
    data = await overview_data(request)
    return next((g for g in data["groups"] if g["name"] == name), None)


@router.get("/ui/groups/{name}/settings", name="web_settings")
@guarded("page")
async def settings_page(request: Request, name: str) -> Response:
    group = await _group_view(request, name)
    if group is None:
        return _no_group(request, name)
    flash = take_flash(request)
    form = flash.get("form") or forms.form_from_config(group["config"])
    return render(request, "settings.html", _settings_context(group, form, flash.get("errors", {})))


@router.post("/ui/groups/{name}/settings", name="web_save_settings")
@guarded("post")
async def save_settings(request: Request, name: str) -> Response:
    group = await _group_view(request, name)
    if group is None:
        return _no_group(request, name)
    form = forms.posted(await form_data(request))
    try:
        body = forms.config_from_form(form, group["nodes"], group["workers"], group["config"])
    except forms.FormErrors as exc:
        return redirect_with(request, f"/ui/groups/{name}/settings", form=form, errors=exc.errors)
    reply = await api.call(request.app, "PUT", f"/api/groups/{name}/config", json=body)
    if not reply.ok:
        errors = forms.errors_from_response(reply.status, reply.body)
        return redirect_with(request, f"/ui/groups/{name}/settings", form=form, errors=errors)
    return RedirectResponse("/ui/", status_code=303)


@router.post("/ui/groups/{name}/preview", name="web_preview")
@guarded("post")
async def preview(request: Request, name: str) -> Response:
    group = await _group_view(request, name)
    if group is None:
        return Response(status_code=404)
    form = forms.posted(await form_data(request))
    return render(request, "preview.html", {"preview": preview_of(group, form)})


# A start of a group without a command, refused on the page where one is set (the API's refusal
# names the CLI's `slurmgen group config`, which a person at this page does not need).
_NO_COMMAND = {
    "_": "This group has no command to run yet: set its Command below and save, then start it.",
    "command": "Required to start the group: the program every rank runs, e.g. python -m slurmgen.train.",
}


async def _without_command(request: Request, name: str) -> bool:
    """Has group `name` no command to start (False when there is no such group: the API says so)?"""
    detail = await _detail(request, name)
    return detail is not None and not detail["group"]["config"].get("argv")


# Last: its path would otherwise catch /settings and /preview.
@router.post("/ui/groups/{name}/{action}", name="web_group_action")
@guarded("post")
async def group_action(request: Request, name: str, action: str) -> Response:
    back = f"/ui/groups/{name}" if f"/ui/groups/{name}" in request.headers.get("referer", "") else "/ui/"
    if action not in ("start", "stop", "restart"):
        return _refused(request, f"Unknown action {action!r} (expected start, stop or restart).")
    if action != "stop" and await _without_command(request, name):
        return redirect_with(request, f"/ui/groups/{name}/settings", errors=_NO_COMMAND)
    if action == "restart":
        reply = await api.call(request.app, "POST", f"/api/groups/{name}/stop")
        if reply.ok:
            await _wait_inactive(request, name)
            reply = await api.call(request.app, "POST", f"/api/groups/{name}/start")
    else:
        reply = await api.call(request.app, "POST", f"/api/groups/{name}/{action}")
    if not reply.ok:
        return redirect_with(request, back, notice=f"Could not {action} group {name!r}: {_refusal(reply)}")
    return RedirectResponse(back, status_code=303)
