"""A real `slurmgen serve`, real local agents and a real Chromium (Debian's, driven by Playwright)
for the coordinator page's tests.

* ``coordinator`` (module scope): `slurmgen serve` on a free loopback port with its token and
  database in a temp dir (XDG_CONFIG_HOME / XDG_STATE_HOME), and two agents with 2 workers each,
  named after loopback hosts (`127.0.0.1`, `localhost`) so a rank's MASTER_ADDR resolves here.
  Everything is stopped (TERM, then KILL) at the end.
* ``cluster_coordinator`` (module scope): the same on the test cluster (tests/integration/
  conftest.py): the server in the root namespace on the controller's address, one agent inside
  each of its first two nodes (`node1`, `node2`), as a person would run it.
* ``browser`` (module scope): Chromium from $PATH, never a downloaded build, with the flags
  that keep it off the network (no background requests from a closed machine).
* ``page`` (per test, on ``cluster_coordinator`` if the test asks for it, else on
  ``coordinator``): a 1280x800 page that records dialogs, console errors and every request
  to another origin (each a test failure, checked after the test), and ``shot(name)``, which
  saves a screenshot per step into test-artifacts/web/<test>/; the folder is deleted when the
  test passes and kept when it fails (SLURMGEN_KEEP_SCREENSHOTS=1 keeps it always).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from helpers import free_port

REPO = Path(__file__).resolve().parents[3]
ARTIFACTS = REPO / "test-artifacts" / "web"
AGENT_HOSTS = ("127.0.0.1", "localhost")
WORKERS_PER_AGENT = 2
START_TIMEOUT = 20.0
BROWSER_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
]


def _stop(proc: subprocess.Popen, grace: float = 5.0) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@dataclass
class Coordinator:
    url: str
    token: str
    home: Path
    env: dict
    procs: list = field(default_factory=list)

    def api(self, method: str, path: str, body: object = None, token: str | None = "") -> tuple[int, object]:
        """A JSON API call with the server's token (token=None: without any)."""
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token or self.token}"
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def wait_workers(self, count: int, timeout: float = START_TIMEOUT) -> list[dict]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status, workers = self.api("GET", "/api/workers")
            if status == 200 and sum(w["state"] in ("idle", "exited") for w in workers) >= count:
                return workers
            time.sleep(0.2)
        raise AssertionError(f"{count} free workers did not register within {timeout} s: {workers}")


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/api/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def _spawn(argv: list[str], env: dict, log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _serve(
    home: Path, env: dict, bind: str, agents: list[tuple[str, list[str]]], procs: list, serve_args: tuple = ()
) -> Coordinator:
    """`slurmgen serve` on `bind` (with `serve_args`), then one agent per (name, argv prefix) with
    2 workers each; every process is added to `procs` as it starts, for the caller to stop."""
    port = free_port()
    url = f"http://{bind}:{port}"
    slurmgen = [sys.executable, "-m", "slurmgen"]
    coord = Coordinator(url, "", home, env, procs)
    coord.procs.append(
        _spawn(slurmgen + ["serve", "--host", bind, "--port", str(port), *serve_args], env, home / "serve.log")
    )
    token_file = home / "config" / "slurmgen" / "token"
    deadline = time.monotonic() + START_TIMEOUT
    while not (_answers(url) and token_file.exists()):
        assert coord.procs[0].poll() is None, (home / "serve.log").read_text()
        assert time.monotonic() < deadline, "slurmgen serve did not answer in time"
        time.sleep(0.1)
    coord.token = token_file.read_text().strip()
    for name, prefix in agents:
        coord.procs.append(
            _spawn(
                prefix
                + slurmgen
                + [
                    "agent",
                    "--server",
                    url,
                    "--token-file",
                    str(token_file),
                    "--workers",
                    str(WORKERS_PER_AGENT),
                    "--name",
                    name,
                    "--grace",
                    "3",
                ],
                env,
                home / f"agent-{name}.log",
            )
        )
    coord.wait_workers(WORKERS_PER_AGENT * len(agents))
    return coord


def _home_env(home: Path, base: dict) -> dict:
    env = {
        **base,
        "XDG_CONFIG_HOME": str(home / "config"),
        "XDG_STATE_HOME": str(home / "state"),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{base.get('PATH', '')}",
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("SLURMGEN_TOKEN", None)
    return env


@contextlib.contextmanager
def _served(
    home: Path, env: dict, bind: str, agents: list[tuple[str, list[str]]], serve_args: tuple = ()
) -> Iterator[Coordinator]:
    procs: list = []
    try:
        yield _serve(home, env, bind, agents, procs, serve_args)
    finally:
        for proc in reversed(procs):
            _stop(proc)


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Coordinator]:
    """Local agents named after loopback hosts, so a rank's MASTER_ADDR resolves here."""
    pytest.importorskip("fastapi", reason="the coordinator needs the serve extra")
    home = tmp_path_factory.mktemp("coordinator")
    with _served(home, _home_env(home, dict(os.environ)), "127.0.0.1", [(host, []) for host in AGENT_HOSTS]) as coord:
        yield coord


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[object]:
    """`serve(agents=("127.0.0.1",))` starts a `slurmgen serve` of this test's own (home:
    tmp_path, `serve_args` added to its command line) and local agents by name; everything is
    stopped when the test ends."""
    pytest.importorskip("fastapi", reason="the coordinator needs the serve extra")
    with contextlib.ExitStack() as stack:

        def start(agents: tuple[str, ...] = (), serve_args: tuple[str, ...] = ()) -> Coordinator:
            env = _home_env(tmp_path, dict(os.environ))
            return stack.enter_context(_served(tmp_path, env, "127.0.0.1", [(host, []) for host in agents], serve_args))

        yield start


@pytest.fixture(scope="module")
def cluster_coordinator(cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Coordinator]:
    """The server in the root namespace, one agent inside each of the test cluster's first two
    nodes (the pages' tests are written for 2 agents x 2 workers, whatever the cluster's size)."""
    pytest.importorskip("fastapi", reason="the coordinator needs the serve extra")
    home = tmp_path_factory.mktemp("coordinator-cluster")
    agents = [
        (n.name, ["nsenter", f"--net=/run/netns/{n.netns}", f"--uts=/proc/{n.slurmd_pid}/ns/uts", "--"])
        for n in cluster.nodes[:2]
    ]
    with _served(home, _home_env(home, cluster.env()), cluster.controller_ip, agents) as coord:
        yield coord


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    sync_api = pytest.importorskip("playwright.sync_api", reason="the test extra installs playwright")
    executable = shutil.which("chromium")
    if executable is None:
        pytest.skip("no chromium on PATH (scripts/setup.sh --test installs Debian's)")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, headless=True, args=BROWSER_FLAGS)
        yield browser
        browser.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.stash[_FAILED] = report.failed


_FAILED = pytest.StashKey[bool]()


def _http_status(text: str) -> bool:
    """Chromium logs a 401/409/422 answer as a console error; that is the server speaking,
    not a script failing."""
    return text.startswith("Failed to load resource: the server responded with a status of")


@dataclass
class Page:
    """The Playwright page plus what the test must not see, and a screenshot per step."""

    page: object
    origin: str
    folder: Path
    dialogs: list = field(default_factory=list)
    answers: list = field(default_factory=list)  # the test's answers to the dialogs it expects, in order
    asked: list = field(default_factory=list)  # the questions those expected dialogs asked
    console_errors: list = field(default_factory=list)
    foreign: list = field(default_factory=list)
    steps: int = 0

    def shot(self, name: str) -> Path:
        self.steps += 1
        path = self.folder / f"{self.steps:02d}-{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def will_answer(self, *answers: bool) -> None:
        """The next dialogs are expected (a stop on several nodes asks first): accept (True) or
        dismiss (False) each, in order; their questions land in `asked`, not in `dialogs`."""
        self.answers.extend(answers)

    def _dialog(self, dialog) -> None:
        if not self.answers:
            self.dialogs.append(dialog.message)
            dialog.dismiss()
            return
        self.asked.append(dialog.message)
        dialog.accept() if self.answers.pop(0) else dialog.dismiss()

    def log_in(self, token: str) -> None:
        self.page.goto(self.origin + "/ui/")
        self.page.get_by_label("Token").fill(token)
        self.page.get_by_role("button", name="Log in").click()
        self.page.wait_for_url(self.origin + "/ui/")


@pytest.fixture
def page(browser, request: pytest.FixtureRequest) -> Iterator[Page]:
    """On the cluster's coordinator when the test asks for it, on a coordinator of the test's own
    (a fixture named own_coordinator, e.g. with stand-in Slurm tools on its PATH), else on the local one."""
    asked = [n for n in ("cluster_coordinator", "own_coordinator") if n in request.fixturenames]
    served = asked[0] if asked else "coordinator"
    coordinator = request.getfixturevalue(served)
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    folder = ARTIFACTS / request.node.name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    p = Page(context.new_page(), coordinator.url, folder)
    p.page.set_default_timeout(10_000)
    p.page.on("dialog", p._dialog)
    p.page.on(
        "console", lambda m: p.console_errors.append(m.text) if m.type == "error" and not _http_status(m.text) else None
    )
    p.page.on("pageerror", lambda e: p.console_errors.append(str(e)))
    p.page.on("request", lambda r: None if r.url.startswith(coordinator.url + "/") else p.foreign.append(r.url))
    try:
        yield p
    finally:
        if request.node.stash.get(_FAILED, True):
            p.shot("at-failure")
        context.close()
        if not request.node.stash.get(_FAILED, True) and not os.environ.get("SLURMGEN_KEEP_SCREENSHOTS"):
            shutil.rmtree(folder, ignore_errors=True)
    assert p.dialogs == [], f"a script opened a dialog: {p.dialogs}"
    assert p.answers == [], f"the dialogs the test expected did not open (asked: {p.asked})"
    assert p.foreign == [], f"the page loaded from another origin: {p.foreign}"
    assert p.console_errors == [], f"console errors: {p.console_errors}"
