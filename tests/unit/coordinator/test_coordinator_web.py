"""The coordinator page's rules without a browser: form <-> config, the server's errors per
field, heartbeat colours, live values, the session/CSRF checks and headers, status.html.
The page in a real Chromium against real processes is tests/integration/web/."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from slurmgen.coordinator.server import create_app  # noqa: E402
from slurmgen.coordinator.service import Coordinator  # noqa: E402
from slurmgen.coordinator.store import Store  # noqa: E402
from slurmgen.coordinator.web import forms, security, status_page, views  # noqa: E402

TOKEN = "t0ken-for-page-tests"
HOSTILE = "<img src=x onerror=alert(1)>"
NODES, MEMBERS = ["gn6", "gn7"], ["gn6-0", "gn6-1", "gn7-0", "gn7-1"]


def test_form_round_trips_a_config_and_keeps_what_it_does_not_show():
    saved = {
        "master": "gn7",
        "world_size": 3,
        "master_port": 29511,
        "backend": "gloo",
        "argv": ["python", "-c", "print('a b')"],
        "cwd": "/work",
        "env": {"A": "1=2", "B": HOSTILE},
        "max_restarts": 2,
    }
    form = forms.form_from_config(saved)
    assert form["command"] == "python -c 'print('\"'\"'a b'\"'\"')'"
    body = forms.config_from_form(form, NODES, MEMBERS, saved)
    assert body == {
        **saved,
        "master_addr": None,
        "strategy": "ddp",
        "restart_mode": "cold",
    }  # the form shows the strategy and the restart mode: the defaults are saved


def test_the_settings_form_sets_min_nodes_and_the_servers_refusal_lands_next_to_it():
    """Issue 35 item 3 for groups: "Min nodes" travels as min_nodes (empty: never fewer nodes), and
    the server's one line for a bad one is shown beside the field."""
    body = forms.config_from_form({"min_nodes": "1", "max_restarts": "2"}, NODES, MEMBERS)
    assert (body["min_nodes"], body["max_restarts"]) == (1, 2)
    assert "min_nodes" not in forms.config_from_form({"min_nodes": " "}, NODES, MEMBERS, {"min_nodes": 1})
    assert forms.form_from_config({"min_nodes": 1})["min_nodes"] == "1"
    with pytest.raises(forms.FormErrors) as caught:
        forms.config_from_form({"min_nodes": "one"}, NODES, MEMBERS)
    assert caught.value.errors == {"min_nodes": "min_nodes: expected a whole number (got 'one')"}
    refused = {"loc": ["body", "min_nodes"], "msg": "Value error, min_nodes: 0 is fewer than 1; expected at least 1"}
    assert forms.errors_from_response(422, {"detail": [refused]}) == {
        "min_nodes": "min_nodes: 0 is fewer than 1; expected at least 1"
    }
    assert forms.errors_from_response(422, {"detail": "min_nodes: 3 is more than nodes (2); expected 1 to 2"}) == {
        "min_nodes": "min_nodes: 3 is more than nodes (2); expected 1 to 2"
    }


@pytest.mark.parametrize(
    "master, expected",
    [("gn6", ("gn6", None)), ("gn6-0", ("gn6-0", None)), ("10.0.0.5", (None, "10.0.0.5")), ("", (None, None))],
)
def test_master_field_is_a_node_a_worker_for_the_server_to_refuse_or_an_address(master, expected):
    body = forms.config_from_form({"master": master}, NODES, MEMBERS)
    assert (body["master"], body["master_addr"]) == expected


def test_form_errors_name_field_and_value():
    with pytest.raises(forms.FormErrors) as caught:
        forms.config_from_form({"world_size": "four", "command": "python 'x", "env": "A=1\nnot a pair"}, NODES, MEMBERS)
    errors = caught.value.errors
    assert errors["world_size"] == "world_size: expected a whole number (got 'four')"
    assert errors["command"].startswith("command: No closing quotation")
    assert errors["env"] == "env line 2: expected KEY=VALUE (got 'not a pair')"


def test_server_errors_land_next_to_their_field():
    pydantic_422 = {
        "detail": [
            {"loc": ["body", "env"], "msg": "Value error, env key 'RANK' is set by the coordinator"},
            {"loc": ["body", "argv", 0], "msg": "bad"},
        ]
    }
    assert forms.errors_from_response(422, pydantic_422) == {
        "env": "env key 'RANK' is set by the coordinator",
        "command": "bad",
    }
    assert forms.errors_from_response(422, {"detail": "world_size: 9 processes asked for"}) == {
        "world_size": "world_size: 9 processes asked for"
    }
    assert forms.errors_from_response(409, {"detail": "group exp1 is running"}) == {"_": "group exp1 is running"}


@pytest.mark.parametrize(
    "age, state, cls",
    [
        (0.4, "idle", "hb-fresh"),
        (6, "running", "hb-late"),
        (20, "running", "hb-dead"),
        (1, "lost", "hb-dead"),
        (None, "idle", "hb-dead"),
    ],
)
def test_heartbeat_turns_amber_then_red(age, state, cls):
    assert views.heartbeat(age, state)[1] == cls


def test_overview_values_and_shape():
    groups = [
        {
            "name": "exp1",
            "state": "failed",
            "exit_code": 3,
            "attempt": 2,
            "restarts": 1,
            "members": 2,
            "config": {"max_restarts": 2, "backend": "gloo", "master_port": 29500},
            "reason": "rank 1 exited 3",
        }
    ]
    workers = [
        {"name": "gn7-0", "host": "gn7", "group": "exp1", "state": "exited", "exit_code": 3, "seen_ago": 0.5},
        {"name": "gn6-0", "host": "gn6", "group": "exp1", "state": "idle", "seen_ago": 7.0},
    ]
    view = views.overview(groups, workers)
    g = view["groups"][0]
    assert (g["state"], g["attempt"], g["master"], g["world_size"]) == ("failed 3", "2 (restart 1 of 2)", "gn6", 2)
    assert [w["name"] for w in view["workers"]] == ["gn6-0", "gn7-0"]
    fields = {tuple(k): (text, cls) for k, text, cls in views.live_fields(view)}
    assert fields[("g", "exp1", "state")] == ("failed 3", "failed")
    assert fields[("w", "gn7-0", "state")] == ("exited 3", "exited")
    assert fields[("w", "gn6-0", "heartbeat")] == ("7 s ago", "hb-late")
    workers[0]["seen_ago"] = 9.0
    assert views.overview(groups, workers)["shape"] == view["shape"], "a heartbeat is a live value, not a redraw"
    workers[1]["group"] = None
    assert views.overview(groups, workers)["shape"] != view["shape"], "a move redraws the region"


def test_a_rank_stopped_because_another_failed_reads_stopped_after_it_in_the_stops_colour():
    """Issue 33: the ranks that only waited read a red "exited 143" beside the one that failed."""
    stopped = {"name": "gn7-0", "host": "gn7", "state": "exited", "exit_code": 143, "stopped_after": 3}
    failed = {"name": "gn6-1", "host": "gn6", "state": "exited", "exit_code": 3, "cause": "rank 3 exited 3"}
    fields = {tuple(k): (text, cls) for k, text, cls in views.live_fields(views.overview([], [stopped, failed]))}
    assert fields[("w", "gn7-0", "state")] == ("stopped (after rank 3)", "stopped")
    assert fields[("w", "gn6-1", "state")] == ("exited 3", "exited")
    assert fields[("w", "gn6-1", "cause")] == ("rank 3 exited 3", "")


def test_a_groups_buttons_that_cannot_act_say_why():
    """An empty group offered Stop and Restart; a group that does not run, Stop."""
    empty = views.group_refusals("idle", [], started=False)
    assert all(why and "no worker has joined" in why for why in empty.values())
    new = views.group_refusals("idle", MEMBERS, started=False)
    assert new["start"] is None and "not started" in new["stop"] and "use Start" in new["restart"]
    assert views.group_refusals("running", MEMBERS, started=True) == {"start": None, "stop": None, "restart": None}
    ended = views.group_refusals("failed 3", MEMBERS, started=True)
    assert ended["stop"] == "the group is not running (failed 3): nothing to stop" and ended["restart"] is None


def test_attempt_is_the_runs_number_everywhere():
    """The card said "Attempt 1 of 1" beside an attempts table and a refusal saying 6; then it said
    "Attempt 6" for the first attempt of a group's sixth start (issue 33): one numbering, the run's
    (contract/attempts.py), as the attempts table, the refusal and the registry number it."""
    sixth = {"name": "exp1", "state": "running", "attempt": 6, "restarts": 0, "config": {}}
    assert views.group_view(sixth, [])["attempt"] == "1"
    assert views.group_view({**sixth, "restarts": 2}, [])["attempt"] == "3"
    assert views.group_view({**sixth, "attempt": None}, [])["attempt"] == "none yet"


def test_a_stop_on_several_nodes_is_asked_first_naming_what_stops():
    """Issue 33, item 10: one click stopped a run on every node. Stop and Restart of a running
    group over two nodes ask first, naming its ranks and nodes; on one node, or when nothing runs,
    nothing is asked. (The browser test checks that the question is asked and a no posts nothing.)"""
    assert views.stop_question("Stop", "run exp.1", 4, 2) == "Stop run exp.1: 4 ranks on 2 nodes?"
    assert views.stop_question("Stop", "run exp.1", 4, 1) is None
    assert views.stop_question("Cancel", "run 7", None, None) is None
    two = ["gn6-0", "gn6-1", "gn7-0", "gn7-1"]
    running = {"name": HOSTILE, "state": "running", "attempt": 1, "config": {}}
    assert views.group_view(running, two)["asks"] == {
        "stop": f"Stop group {HOSTILE}: 4 ranks on 2 nodes?",
        "restart": f"Restart group {HOSTILE}: 4 ranks on 2 nodes?",
    }
    assert views.group_view(running, two[:2])["asks"] == {"stop": None, "restart": None}
    assert views.group_view({**running, "state": "failed"}, two)["asks"] == {}


def test_sessions_are_random_expire_and_are_revoked():
    clock = [1000.0]
    sessions = security.Sessions(lifetime=60, clock=lambda: clock[0])
    (one, first), (two, second) = sessions.create(), sessions.create()
    assert one != two and first.csrf != second.csrf and TOKEN not in one
    assert sessions.get(one) is first and first.csrf_ok(first.csrf) and not first.csrf_ok(second.csrf)
    sessions.revoke(one)
    assert sessions.get(one) is None and sessions.get(two) is second
    clock[0] += 61
    assert sessions.get(two) is None, "a session ends after its lifetime"
    assert sessions.get(None) is None and sessions.get("made-up") is None
    assert security.same_origin({"origin": "http://127.0.0.1:8470"}, "http://127.0.0.1:8470")
    assert not security.same_origin({"origin": "null"}, "http://127.0.0.1:8470")
    assert "'unsafe-inline'" not in security.CONTENT_SECURITY_POLICY
    assert "frame-ancestors 'none'" in security.CONTENT_SECURITY_POLICY


def test_chart_scales_every_series_into_the_box():
    c = status_page.chart({"train": ([1, 2, 3], [3.0, 2.0, 1.0]), "val": ([3], [1.5])})
    xs = [float(p.split(",")[0]) for line in c["lines"] for p in line["points"].split()]
    ys = [float(p.split(",")[1]) for line in c["lines"] for p in line["points"].split()]
    assert min(xs) == status_page.PAD and max(xs) == status_page.WIDTH - status_page.PAD
    assert min(ys) == status_page.PAD and max(ys) == status_page.HEIGHT - status_page.PAD
    assert status_page.chart({})["lines"] == []


def test_status_html_escapes_and_draws():
    detail = {
        "group": {"name": "exp1", "state": "failed", "exit_code": 3, "attempt": 1, "reason": HOSTILE, "config": {}},
        "workers": [{"name": "gn6-0", "host": "gn6", "state": "exited", "exit_code": 3}],
        "attempts": [
            {"number": 1, "state": "failed", "started": 1.0, "ended": 2.0, "reason": HOSTILE, "exit_codes": {"0": 3}}
        ],
    }
    ranks = [{"worker": "gn6-0", "host": "gn6", "rank": 0, "local_rank": 0, "node_rank": 0}]
    html = status_page.render_status(detail, ranks, {"loss": {"train": ([1, 2], [2.0, 1.0])}})
    assert HOSTILE not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "failed 3" in html and "<polyline" in html and "<script" not in html


@pytest.fixture
def client(tmp_path):
    store = Store(tmp_path / "c.db")
    with TestClient(create_app(Coordinator(store), TOKEN), base_url="http://testserver") as c:
        yield c
    store.close()


def _log_in(client) -> str:
    client.post("/ui/login", data={"token": TOKEN}, headers={"Origin": "http://testserver"})
    return re.search(r'name="csrf" value="([A-Za-z0-9_-]+)"', client.get("/ui/").text).group(1)


def test_page_needs_a_session_and_posts_need_csrf_and_same_origin(client):
    assert client.get("/ui/", follow_redirects=False).headers["location"] == "/ui/login?next=/ui/"
    assert client.get("/ui/live/overview").status_code == 401
    assert client.post("/ui/login", data={"token": "nope"}).status_code == 401
    csrf = _log_in(client)
    assert client.post("/ui/groups", data={"name": "a"}).status_code == 403
    assert (
        client.post(
            "/ui/groups", data={"name": "a", "csrf": csrf}, headers={"Origin": "http://evil.example"}
        ).status_code
        == 403
    )
    assert client.post("/ui/groups", data={"name": "a", "csrf": csrf}, follow_redirects=False).status_code == 303
    assert [g["name"] for g in client.get("/api/groups", headers={"Authorization": f"Bearer {TOKEN}"}).json()] == ["a"]
    page = client.get("/ui/")
    assert page.headers["content-security-policy"] == security.CONTENT_SECURITY_POLICY
    assert page.headers["x-frame-options"] == "DENY"


def test_login_redirects_only_inside_the_page(client):
    reply = client.post("/ui/login", data={"token": TOKEN, "next": "//evil.example/x"}, follow_redirects=False)
    assert reply.headers["location"] == "/ui/"
    assert "slurmgen_session=" in reply.headers["set-cookie"] and "HttpOnly" in reply.headers["set-cookie"]
    assert "samesite=strict" in reply.headers["set-cookie"].lower()


def test_refusals_are_shown_as_text(client):
    csrf = _log_in(client)
    reply = client.post("/ui/groups", data={"name": HOSTILE, "csrf": csrf})
    assert reply.history[0].status_code == 303 and reply.url.path == "/ui/", "a refusal redirects to a page"
    assert HOSTILE not in reply.text and "&lt;img src=x onerror=alert(1)&gt;" in reply.text
    assert "&lt;img" not in client.get("/ui/").text, "the notice shows once"


def _record(root, group, job_type="main", steps=(1,), metric="loss", kind="train"):
    from slurmgen import tracking

    place = {"rank": 0, "local_rank": 0, "node_rank": 0, "world_size": 1}
    with tracking.init(root, group=group, job_type=job_type, place=place, environ={}) as run:
        for step in steps:
            run.log(type=kind, metrics={metric: 1.0 / step}, step=step)
        return str(run.dir)


def test_curves_come_from_the_attempts_own_records(tmp_path):
    """Records were found by walking --cwd and matched by group name: two runs of job type
    "main" shared one label, and a later attempt without records still showed old curves."""
    from slurmgen.coordinator.web import attempt_records

    one = _record(tmp_path / "a" / "tracking", "exp1", steps=(1, 2))
    two = _record(tmp_path / "b" / "tracking", "exp1", steps=(5,), kind="val")
    _record(tmp_path / "c" / "tracking", "exp1", steps=(9,))  # same group name, another attempt's
    attempt = {"number": 2, "runs": [one, two, str(tmp_path / "gone")]}
    detail = {"group": {"attempt": 2}, "attempts": [{"number": 1, "runs": []}, attempt]}
    runs = attempt_records.attempt_runs(attempt_records.current_attempt(detail))
    assert [str(r.dir) for r in runs] == [one, two], "exactly the announced records the server can read"
    assert attempt_records.curves_of(runs) == {
        "loss": {f"train {one}": ([1, 2], [1.0, 0.5]), f"val {two}": ([5], [0.2])}
    }
    assert attempt_records.curves_of(attempt_records.attempt_runs({"number": 3, "runs": []})) == {}
    assert attempt_records.status_dir("exp1", tmp_path, runs, tmp_path / "state") == tmp_path
    assert attempt_records.status_dir("exp1", tmp_path, [], tmp_path / "state") == tmp_path / "runs" / "exp1"
    assert attempt_records.status_dir("exp1", None, [], tmp_path / "state") == tmp_path / "state" / "groups" / "exp1"


def test_two_runs_of_one_job_type_are_two_series(tmp_path):
    from slurmgen.coordinator.web import attempt_records

    one = _record(tmp_path / "a", "exp1", steps=(1, 2))
    two = _record(tmp_path / "b", "exp2", steps=(1, 2))
    same = _record(tmp_path / "c", "exp1", steps=(3,))
    labels = list(attempt_records.curves_of(attempt_records.attempt_runs({"runs": [one, two, same]}))["loss"])
    assert labels == [f"train {one}", "train exp2/main", f"train {same}"]


def test_each_login_is_its_own_session_with_an_expiry_and_logout_revokes_it(tmp_path):
    """The cookie was one fixed HMAC of the token, never expiring, still valid after Log out."""
    store = Store(tmp_path / "c.db")
    app = create_app(Coordinator(store), TOKEN)
    with TestClient(app, base_url="http://testserver") as one, TestClient(app, base_url="http://testserver") as two:
        csrf_one, csrf_two = _log_in(one), _log_in(two)
        cookie_one, cookie_two = one.cookies["slurmgen_session"], two.cookies["slurmgen_session"]
        assert cookie_one != cookie_two and csrf_one != csrf_two
        login = one.post("/ui/login", data={"token": TOKEN}, follow_redirects=False)
        assert re.search(r"max-age=\d+", login.headers["set-cookie"], re.I), "the cookie expires"
        one.cookies.clear()  # one cookie of that name, whichever HTTP client the test client uses
        one.cookies.set("slurmgen_session", cookie_one)
        assert one.post("/ui/groups", data={"name": "a", "csrf": csrf_two}).status_code == 403, "CSRF is per session"
        assert one.post("/ui/logout", data={"csrf": csrf_one}, follow_redirects=False).status_code == 303
        one.cookies.clear()
        one.cookies.set("slurmgen_session", cookie_one)  # a copy of the cookie kept from before
        assert one.get("/ui/live/overview").status_code == 401, "logged out means logged out"
        assert one.post("/ui/groups", data={"name": "a", "csrf": csrf_one}).status_code == 401
        assert two.get("/ui/live/overview").status_code == 200, "other sessions stay"
    store.close()


def test_every_form_post_redirects_to_a_page(client):
    """After a refused POST the address bar kept the POST's URL (a reload posted again)."""
    assert client.post("/ui/login", data={"token": "nope"}, follow_redirects=False).status_code == 303
    csrf = _log_in(client)
    assert client.get("/ui/login", follow_redirects=False).headers["location"] == "/ui/", "logged in: no login form"
    posts = [
        ("/ui/groups", {"name": "bad name"}, "/ui/"),
        ("/ui/groups", {"name": "exp1"}, "/ui/"),
        ("/ui/groups", {"name": "exp1"}, "/ui/"),
        ("/ui/move", {}, "/ui/"),
        ("/ui/move", {"worker": "gn6-0", "to": "exp1"}, "/ui/"),
        ("/ui/groups/exp1/start", {}, "/ui/groups/exp1/settings"),  # no command yet: where one is set
        ("/ui/groups/exp1/jump", {}, "/ui/"),
        ("/ui/groups/nope/settings", {"world_size": "2"}, "/ui/"),
        ("/ui/groups/exp1/settings", {"world_size": "four"}, "/ui/groups/exp1/settings"),
        ("/ui/groups/exp1/settings", {"workdir": "relative"}, "/ui/groups/exp1/settings"),
    ]
    for path, form, target in posts:
        reply = client.post(path, data={**form, "csrf": csrf}, follow_redirects=False)
        assert (reply.status_code, reply.headers.get("location")) == (303, target), (path, form, reply.text[:200])
    page = client.get("/ui/groups/exp1/settings")
    assert page.status_code == 200 and "cwd &#39;relative&#39; must be an absolute path" in page.text
    assert 'value="relative"' in page.text, "the refused form comes back as typed"
    assert "must be an absolute path" not in client.get("/ui/groups/exp1/settings").text, "shown once"


def test_starting_a_group_without_a_command_opens_its_settings_form_saying_what_to_set(client):
    """Issue 33 item 11: the page answered with the API's CLI instruction (`slurmgen group config
    NAME -- CMD`) beside a Settings form that sets the command; now that form, its Command field
    marked. Once a command is saved, Start starts (the API's own refusals still come back as they were)."""
    csrf = _log_in(client)
    client.post("/ui/groups", data={"name": "exp1", "csrf": csrf})
    for action in ("start", "restart"):
        reply = client.post(f"/ui/groups/exp1/{action}", data={"csrf": csrf}, follow_redirects=False)
        assert (reply.status_code, reply.headers["location"]) == (303, "/ui/groups/exp1/settings")
        page = client.get("/ui/groups/exp1/settings").text
        assert "set its Command below and save, then start it" in page and "slurmgen group config" not in page
        assert 'id="command-error"' in page and 'aria-describedby="command-error"' in page
    nope = client.post("/ui/groups/nope/start", data={"csrf": csrf}, follow_redirects=False)
    assert nope.headers["location"] == "/ui/" and "group &#39;nope&#39; does not exist" in client.get("/ui/").text
    saved = client.post("/ui/groups/exp1/settings", data={"command": "true", "csrf": csrf}, follow_redirects=False)
    assert saved.headers["location"] == "/ui/", client.get("/ui/groups/exp1/settings").text
    reply = client.post("/ui/groups/exp1/start", data={"csrf": csrf}, follow_redirects=False)
    assert reply.headers["location"] == "/ui/" and "no command" not in client.get("/ui/").text


def test_the_ranks_of_a_stopped_attempt_read_stopped_by_you_not_failed():
    """Issue 33, item 10: a person's stop drew "failed (exit 75)" for the ranks it stopped. The
    attempt's end state (the registry's, through the timeline's attempt bounds) says it was a stop."""
    from slurmgen.coordinator.web.timeline_svg import rank_rows
    from slurmgen.observe.timeline import build

    events = [
        {"event": "first_step", "rank": r, "attempt": 1, "time": 10.0 + r, "step": 1, "host": "gn7"} for r in (0, 1)
    ] + [
        {"event": "end", "rank": 0, "attempt": 1, "time": 20.0, "status": "failed", "code": 75},
        {"event": "end", "rank": 1, "attempt": 1, "time": 20.0, "status": "done", "code": 0},
    ]
    stopped = [
        {"event": "start", "attempt": 1, "time": 9.0},
        {"event": "end", "attempt": 1, "time": 21.0, "state": "stopped"},
    ]
    (a,) = build(events, stopped)["attempts"]
    assert [r["status"] for r in rank_rows(a, set(), False)] == ["stopped by you", "done"]
    (failed,) = build(events, [*stopped[:1], {**stopped[1], "state": "failed"}])["attempts"]
    assert [r["status"] for r in rank_rows(failed, set(), False)] == ["failed (exit 75)", "done"]


def _contrast(a: str, b: str) -> float:
    """WCAG 2's contrast ratio of two #rrggbb colours."""

    def luminance(colour: str) -> float:
        channels = [int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5)]
        r, g, b = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
        return 0.2126 * r + 0.7152 * g + 0.0722 * b

    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def test_timeline_and_goodput_colours_stand_out_from_white():
    """Issue 33 item 11: the timeline's green, amber and grey were under 3:1 against white (WCAG's
    minimum for graphics): a bar and its legend swatch vanished for many readers."""
    from slurmgen.coordinator.web.timeline_svg import COLOUR, GOODPUT_COLOUR

    faint = {part: round(_contrast(c, "#ffffff"), 2) for part, c in {**COLOUR, **GOODPUT_COLOUR}.items()}
    assert all(ratio >= 3 for ratio in faint.values()), faint


def test_state_badges_are_readable_and_a_users_stop_is_neutral():
    """White badge text at least 4.5:1 on every state's colour; "stopped by you" (and stopping) in
    a neutral slate, not the warning's orange or the failure's red (issue 33 items 10 and 11)."""
    from importlib.resources import files

    css = files("slurmgen.coordinator.web").joinpath("static/app.css").read_text()
    colours = dict(re.findall(r"--([a-z]+): (#[0-9a-f]{6})", css))
    for name in ("ok", "run", "warn", "bad", "idle", "stop"):
        assert _contrast(colours[name], "#ffffff") >= 4.5, name
    assert ".state-stopped, .state-stopping { background: var(--stop); }" in css
    assert colours["stop"] not in (colours["warn"], colours["bad"])
