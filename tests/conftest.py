"""Suite-wide test policy.

* Everything under tests/integration/ is marked ``integration`` (select or drop it with
  ``-m integration`` / ``-m "not integration"``).
* Under CI (env ``CI`` set to anything but ``""``, ``0``, ``false`` or ``no``) an integration
  test that skips is a failure: CI installs every package and runs as root, so a skip there
  means the test cluster or a dependency silently went missing. Outside CI the skip stays a
  skip with its reason (not root, package missing, namespaces refused). The same holds for the
  `shellcheck` fixture in every test: CI installs shellcheck, so its absence there is a failure.
* SIGINT is at its default in every program the tests start, even when the suite itself was
  started with it ignored (see pytest_configure).
* The unit tests may run on pytest-xdist workers (``-n 2``); what the suite shares between
  tests (the heartbeat-directory sweep below) is done by the controlling process.
"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest

INTEGRATION_DIR = Path(__file__).resolve().parent / "integration"
ROOT = Path(__file__).resolve().parents[1]


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@pytest.fixture(scope="session")
def shellcheck() -> str:
    """shellcheck's path, for the tests that lint shell text. Missing, it skips the test on a
    workstation, but fails it under CI, where scripts/setup.sh --test installs it."""
    path = shutil.which("shellcheck")
    if path is None:
        if in_ci():
            pytest.fail(
                f"shellcheck is not installed under CI={os.environ.get('CI')!r} (scripts/setup.sh --test installs it)"
            )
        pytest.skip("shellcheck is not installed: run scripts/setup.sh --test")
    return path


def _is_integration_path(path: Path) -> bool:
    try:
        Path(path).resolve().relative_to(INTEGRATION_DIR)
    except ValueError:
        return False
    return True


def pytest_configure(config: pytest.Config) -> None:
    """The tests press Ctrl-C (SIGINT) on the scripts and launchers they start, which must act on it.

    A non-interactive shell starts what it runs in the background (`scripts/test.sh &`) with
    SIGINT ignored; every program the tests start inherits that, and bash cannot trap a signal
    ignored on entry: launch_multi_node.sh let the INT pass and exited 143 on the TERM after it.
    A Python handler is not inherited (exec resets it to the default), an ignored signal is."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from helpers import fault_matrix  # the fault suite is the table of docs/guides/faults.md

    faults = {node for _, nodes in fault_matrix() for node in nodes}
    for item in items:
        if _is_integration_path(item.path):
            item.add_marker(pytest.mark.integration)
        if f"{Path(item.path).resolve().relative_to(ROOT)}::{item.originalname}" in faults:
            item.add_marker(pytest.mark.fault)


def _skip_reason(longrepr: object) -> str:
    # A skip's longrepr is (file, line, "Skipped: reason").
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    outcome = yield
    report = outcome.get_result()
    if not (report.skipped and in_ci() and item.get_closest_marker("integration")):
        return
    if hasattr(report, "wasxfail"):  # an expected failure is not a missing resource
        return
    report.outcome = "failed"
    report.longrepr = (
        f"integration test skipped under CI={os.environ.get('CI')!r}, which counts as a "
        f"failure: {_skip_reason(report.longrepr)}"
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    # A module-level pytest.skip()/importorskip() in tests/integration skips at collection.
    outcome = yield
    report = outcome.get_result()
    path = getattr(collector, "path", None)
    if report.skipped and in_ci() and path is not None and _is_integration_path(path):
        report.outcome = "failed"
        report.longrepr = (
            f"integration module skipped under CI={os.environ.get('CI')!r}, which counts as a "
            f"failure: {_skip_reason(report.longrepr)}"
        )


# Where trainers write heartbeats when no launcher names a directory (train/logs.py
# node_local_dir). A clean run removes its directory; a run the tests kill on purpose (kill -9,
# fault injection, a failed rank) leaves it for the product's own stale-directory sweep, which
# waits an hour. The suite does not wait: what it left there goes at the end of the session.
# Under pytest-xdist this is done by the controlling process only, around all the workers: a
# worker that finished early would otherwise remove the directories of the runs another worker
# still has going.
HEARTBEAT_LEFTOVERS = "slurmgen-heartbeats-*"
_HEARTBEATS_BEFORE = pytest.StashKey[set[Path]]()


def _is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_sessionstart(session: pytest.Session) -> None:
    if not _is_xdist_worker(session.config):
        session.config.stash[_HEARTBEATS_BEFORE] = set(Path("/dev/shm").glob(HEARTBEAT_LEFTOVERS))


def pytest_sessionfinish(session: pytest.Session) -> None:
    before = session.config.stash.get(_HEARTBEATS_BEFORE, None)
    if before is None:
        return
    for d in set(Path("/dev/shm").glob(HEARTBEAT_LEFTOVERS)) - before:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(autouse=True)
def _private_registry(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """`slurmgen launch` (and `serve`) record every run in the run registry: in the tests, in a
    file of their own (SLURMGEN_REGISTRY, which the programs they start inherit), never in the
    user's ~/.local/state. A test that wants another passes --registry or sets it itself."""
    monkeypatch.setenv("SLURMGEN_REGISTRY", str(tmp_path_factory.mktemp("registry") / "jobs.sqlite"))


from helpers import fake_slurm, login_node  # noqa: E402, F401  (fixtures every test may ask for)
