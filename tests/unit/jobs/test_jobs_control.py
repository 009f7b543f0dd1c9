"""A run's controls (jobs/control.py): the pure decision of what applies to a run and why not,
and the one entry the CLI, the page and the JSON API call, against a stand-in Slurm runner
(tests/integration drives the real scancel and scontrol)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from slurmgen.contract.states import STOP_ASKED, State, from_slurm
from slurmgen.errors import SlurmgenError
from slurmgen.jobs import control
from slurmgen.jobs.control import Run, RunControl, Status
from slurmgen.jobs.slurm_runner import Result
from slurmgen.runs.model import Failure, NewRun, add_run, end_run, get_row
from slurmgen.runs.registry import JobRecord, Registry

DATA = Path(__file__).parent / "data" / "slurm"
CANCEL, CHECKPOINT, REQUEUE, STOP = RunControl.CANCEL, RunControl.CHECKPOINT, RunControl.REQUEUE, RunControl.STOP


def scontrol_line(job_id: str, state: str) -> str:
    """The recorded `scontrol show job -o` line of a running job, under this id and in this state."""
    text = (DATA / "scontrol_running.txt").read_text().partition("\n#")[0]
    text = re.sub(r"\bJobId=\S*", f"JobId={job_id}", text, count=1)
    return re.sub(r"\bJobState=\S*", f"JobState={state}", text, count=1)


class SlurmStub:
    """A Slurm runner: `scontrol show job` says `state` (CANCELLED once scancel was sent without a
    signal), accounting is off; what it was asked to do is kept in `sent`."""

    where = "local"

    def __init__(self, job_id: str, state: str):
        self.job_id, self.state, self.sent = job_id, state, []

    def run(self, argv, *, cwd=None, stdin=b"", timeout=60):
        if argv[:3] == ["scontrol", "show", "job"]:
            return Result(0, scontrol_line(self.job_id, self.state), "")
        if argv[0] == "sacct":
            return Result(1, "", "Slurm accounting storage is disabled\n")
        self.sent.append(list(argv))
        if argv == ["scancel", self.job_id]:
            self.state = "CANCELLED"
        return Result(0, "", "")

    def read(self, path, offset=0):
        return None

    def close(self):
        pass


class Opener:
    """Runners as cli_shared.Runners opens them: the places asked for are kept."""

    def __init__(self, runner):
        self.runner, self.asked = runner, []

    def __call__(self, where, setup, ssh_config):
        self.asked.append((where, setup, ssh_config))
        return self.runner


def never(*args):
    raise AssertionError(f"no runner should be opened: {args}")


@pytest.fixture
def reg(tmp_path):
    with Registry.open(tmp_path / "jobs.sqlite", create=True) as reg:
        yield reg


def slurm_job(reg: Registry, job_id: str = "4", **info) -> Run:
    reg.add(JobRecord(job_id, "train", "/w/out", float(job_id), None, "RUNNING", None, {"command": ["x"], **info}))
    return control.read(reg, reg.get(job_id).seq)


def ended_launch(reg: Registry) -> Run:
    seq = add_run(reg, NewRun("launch", "L0", "old", "/w", 2, 4, info={"pid": 1, "stop_file": "/x"}), 50.0)
    end_run(reg, seq, State.FAILED, 1, Failure("rank 3 exited 1", 3, "node2", 1), 60.0)
    return control.read(reg, seq)


def group_run(**fields) -> Run:
    return Run(**{"seq": 9, "kind": "group", "key": "g.1", "state": "running", "cluster": "", "remote": None,
                  "info": {}, **fields})  # fmt: skip


# ---- the typed run ------------------------------------------------------------------------------
def test_a_run_is_read_once_in_one_shape_whichever_way_it_was_found(reg):
    run = slurm_job(reg, preempt_signal="USR1")
    assert (run.kind, run.key, run.state, run.remote, run.info["preempt_signal"]) == (
        "slurm",
        "4",
        "running",
        None,
        "USR1",
    )
    assert run.job is not None and run.job.job_id == "4" and run.job.seq == run.seq
    found = Run.of_job(reg.get("4"))  # as `slurmgen cancel 4` finds it (resolve.find)
    assert (found.seq, found.kind, found.key, found.state, found.cluster, found.remote) == (
        run.seq,
        run.kind,
        run.key,
        run.state,
        run.cluster,
        run.remote,
    )
    launch = ended_launch(reg)
    assert (launch.kind, launch.key, launch.state, launch.job) == ("launch", "L0", "failed", None)
    assert control.read(reg, 999) is None


# ---- the decision -------------------------------------------------------------------------------
@pytest.mark.parametrize("word", ["COMPLETED", "CANCELLED by 1000", "SPECIAL_EXIT", "REVOKED"])
def test_a_slurm_job_in_a_final_state_cannot_be_cancelled_from_its_page(reg, word):
    offered = control.choices(slurm_job(reg), {"state": word})
    assert {offered[CANCEL], offered[CHECKPOINT]} == {f"the job has ended ({word.split()[0]})"}, offered


def test_a_slurm_job_is_offered_what_its_slurm_state_allows(reg):
    run = slurm_job(reg)
    assert control.choices(run, {"state": "RUNNING"}) == {
        CANCEL: None,
        CHECKPOINT: None,
        REQUEUE: "the job is RUNNING, not ended: only a failed or preempted job is requeued",
    }
    pending = control.choices(run, {"state": "PENDING"})
    assert pending[CANCEL] is None and pending[CHECKPOINT] == "the job is PENDING, not running: nothing to save"
    assert control.choices(run, {"state": "FAILED"})[REQUEUE] is None
    forgotten = control.choices(run, {})  # Slurm gave nothing: it no longer knows the job
    assert forgotten[CANCEL] == "the job has ended (unknown to Slurm)"
    assert forgotten[REQUEUE].startswith("Slurm no longer knows the job")
    assert control.choices(run, {"state": "UNKNOWN"})[REQUEUE].startswith("Slurm no longer knows the job")


def test_a_launch_and_a_group_run_are_offered_their_stop_and_no_slurm_control(reg, tmp_path):
    """A launch's and a group run's pages showed a Slurm job's Cancel and Checkpoint, always disabled."""
    assert control.choices(ended_launch(reg), {}) == {STOP: "the launch has ended (failed)"}
    channel = {"stop_file": str(tmp_path / "control" / "group-g.1.stop")}
    assert control.choices(group_run(info=channel), {}) == {STOP: None}
    assert (
        control.choices(group_run(info=channel, state="stopped"), {})[STOP]
        == "the group run has ended (stopped by you)"
    )
    assert control.choices(group_run(), {})[STOP] == (
        "this group run was started by a slurmgen without a stop channel: stop it from its group's page"
    )
    assert control.label(STOP, "group") == "Stop" and control.label(STOP, "launch") == "Stop launch"


def test_a_control_of_another_kind_of_run_is_refused_before_anything_is_sent(reg):
    launch, job = ended_launch(reg), slurm_job(reg)
    assert (
        control.refusal(launch, CANCEL)
        == f"run {launch.seq} is not a Slurm job of this machine's registry: nothing was sent"
    )
    assert (
        control.refusal(launch, REQUEUE)
        == f"run {launch.seq} is 'launch', not a Slurm job: only a Slurm job is requeued"
    )
    assert control.refusal(job, STOP) == (
        f"run {job.seq} is 'slurm', not an SSH launch or a group's run: only those are stopped (cancel a Slurm job)"
    )
    assert control.refusal(group_run(), STOP) is None  # the coordinator's channel is asked next
    assert (
        control.refusal(group_run(), CANCEL) == "run 9 is not a Slurm job of this machine's registry: nothing was sent"
    )
    assert all(control.refusal(job, c) is None for c in (CANCEL, CHECKPOINT, REQUEUE))
    assert control.refusal(launch, STOP) is None  # the launcher's own rules are asked next (stop_request.why_not)
    for c in (CANCEL, CHECKPOINT, REQUEUE, STOP):
        done = control.perform(reg, launch if c != STOP else job, c, never, "from a test")
        assert done.status == Status.REFUSED and not done.done


def test_no_such_run_says_what_was_not_done():
    assert control.no_run(7, CANCEL) == control.Outcome(
        Status.NO_RUN, "there is no run 7 in this machine's registry: nothing was sent"
    )
    assert control.no_run(7, REQUEUE).said.endswith("nothing was requeued")
    assert control.no_run(7, STOP).said.endswith("nothing was stopped")


# ---- the side effects ---------------------------------------------------------------------------
def test_cancel_scancels_the_job_where_it_was_submitted_and_waits_for_its_end(reg):
    run = slurm_job(reg, remote_setup=["module load slurm"])
    opener = Opener(SlurmStub("4", "RUNNING"))
    done = control.perform(reg, run, CANCEL, opener, "from a test")
    assert (done.status, done.said, done.slurm["ended"], done.warning) == (Status.DONE, "job 4: CANCELLED", True, None)
    assert opener.runner.sent == [["scancel", "4"]] and opener.asked == [(None, ["module load slurm"], None)]


def test_checkpoint_sends_the_jobs_preempt_signal_and_warns_of_a_program_without_a_handler(reg):
    opener = Opener(SlurmStub("4", "RUNNING"))
    done = control.perform(reg, slurm_job(reg, preempt_signal="USR1"), CHECKPOINT, opener, "from a test")
    assert (done.status, done.said) == (Status.DONE, "sent USR1 to 4")
    assert opener.runner.sent[-1] == ["scancel", "--signal=USR1", "4"]
    assert done.warning.startswith("job 4 runs `x`, which did not declare that it handles USR1")
    assert reg.get("4").info["signals"][0]["signal"] == "USR1"  # kept for `slurmgen status`


def test_an_ended_job_is_left_alone_and_the_refusal_says_how_it_ended(reg):
    opener = Opener(SlurmStub("4", "COMPLETED"))
    done = control.perform(reg, slurm_job(reg), CANCEL, opener, "from a test")
    assert (done.status, done.said) == (Status.REFUSED, "job 4 had already ended: COMPLETED, exit code 0")
    assert done.error is None and opener.runner.sent == []


def test_requeue_only_a_failed_job(reg):
    failed = Opener(SlurmStub("4", "FAILED"))
    done = control.perform(reg, slurm_job(reg), REQUEUE, failed, "from a test")
    assert done.done and done.said.startswith("requeued job 4 (it was FAILED)")
    assert failed.runner.sent == [["scontrol", "requeue", "4"]]
    running = Opener(SlurmStub("4", "RUNNING"))
    done = control.perform(reg, control.read(reg, reg.get("4").seq), REQUEUE, running, "from a test")
    assert done.status == Status.REFUSED and running.runner.sent == []


def test_a_job_whose_id_a_later_job_has_is_not_cancelled(reg):
    older = slurm_job(reg, "5")
    reg.add(JobRecord("5", "second", "/w/b", 6.0, None, "RUNNING", None, {"command": ["x"]}))
    done = control.perform(reg, older, CANCEL, never, "from a test")
    assert done.status == Status.REFUSED and done.said.startswith("cancel: the id 5 now names a later job, 'second'")
    assert isinstance(done.error, SlurmgenError) and str(done.error) == done.said  # the CLI raises it: exit 2


def test_a_login_node_that_does_not_answer_is_an_outcome_not_an_exception(reg):
    def unreachable(where, setup, ssh_config):
        raise SlurmgenError("ssh: login1: connection refused", exit_code=1)

    done = control.perform(reg, slurm_job(reg), CANCEL, unreachable, "from a test")
    assert (done.status, done.said, done.error.exit_code) == (Status.UNANSWERED, "ssh: login1: connection refused", 1)


def test_stopping_an_ended_launch_is_refused_by_its_launcher_rules(reg):
    done = control.perform(reg, ended_launch(reg), STOP, never, "from a test")
    assert (done.status, done.said) == (Status.REFUSED, "launch L0 was not stopped: the launch has ended (failed)")


# ---- "checkpoint and stop" stops (issue 33, item 6) ---------------------------------------------
class Refusing(SlurmStub):
    """A Slurm that refuses `scontrol update` (an old one, or a job another user owns)."""

    def run(self, argv, *, cwd=None, stdin=b"", timeout=60):
        if argv[:2] == ["scontrol", "update"]:
            self.sent.append(list(argv))
            return Result(1, "", "slurm_update error: Access/permission denied\n")
        return super().run(argv, cwd=cwd, stdin=stdin, timeout=timeout)


def test_checkpoint_and_stop_keeps_the_job_from_requeueing_before_the_signal(reg):
    """Submitted without --no-requeue, the trainer requeued the job after its checkpoint and the
    page said "pending: requeued": the job is made not requeueable first, and the stop is the user's."""
    opener = Opener(SlurmStub("4", "RUNNING"))
    done = control.perform(reg, slurm_job(reg), CHECKPOINT, opener, "from a test")
    assert done.done and opener.runner.sent == [
        ["scontrol", "update", "JobId=4", "Requeue=0"],
        ["scancel", "--signal=USR2", "4"],
    ]
    assert reg.get("4").info[STOP_ASKED]["by"] == "from a test"
    row = get_row(reg, reg.get("4").seq)
    assert (row["state"], row["last_state"]) == (State.STOPPING.value, "RUNNING")  # until Slurm says it ended
    reg.remember_states({row["seq"]: ("COMPLETING", None)})  # Slurm's word changes, its ranks still run
    assert get_row(reg, row["seq"])["state"] == State.STOPPING.value
    # A plain cancel --signal (the CLI's) is no stop of the user's: the job's requeue is left as it is.
    other = Opener(SlurmStub("5", "RUNNING"))
    control.perform(reg, slurm_job(reg, "5"), CANCEL, other, "from a test", signal="USR2")
    assert other.runner.sent == [["scancel", "--signal=USR2", "5"]] and STOP_ASKED not in reg.get("5").info


def test_checkpoint_and_stop_sends_nothing_when_the_job_cannot_be_kept_from_requeueing(reg):
    opener = Opener(Refusing("4", "RUNNING"))
    done = control.perform(reg, slurm_job(reg), CHECKPOINT, opener, "from a test")
    assert done.status == Status.REFUSED and done.said == (
        "job 4 could not be kept from requeueing (scontrol: slurm_update error: Access/permission denied); "
        "nothing was sent"
    )
    assert (
        opener.runner.sent == [["scontrol", "update", "JobId=4", "Requeue=0"]] and STOP_ASKED not in reg.get("4").info
    )


def test_the_jobs_exit_after_the_users_checkpoint_and_stop_reads_stopped_not_preempted(reg):
    control.perform(reg, slurm_job(reg), CHECKPOINT, Opener(SlurmStub("4", "RUNNING")), "from a test")
    slurm_job(reg, "6")  # preempted by Slurm's own warning: no person asked
    seqs = {job: reg.get(job).seq for job in ("4", "6")}
    reg.remember_states({seq: ("FAILED", 75) for seq in seqs.values()})
    assert {job: get_row(reg, seq)["state"] for job, seq in seqs.items()} == {
        "4": State.STOPPED.value,
        "6": State.PREEMPTED.value,
    }
    assert from_slurm("FAILED", 75, stop_asked=True) is State.STOPPED
    assert from_slurm("FAILED", 1, stop_asked=True) is State.FAILED  # a crash while stopping is a failure
    # Slurm then refuses to requeue it (the cluster test saw "presently disabled", Requeue=1 or not):
    # the page says so on a disabled button and the control sends nothing.
    stopped = control.read(reg, seqs["4"])
    why = "you stopped it (checkpoint and stop), after which Slurm does not requeue it: submit it again to resume"
    assert control.choices(stopped, {"state": "FAILED"})[REQUEUE] == why
    assert control.choices(stopped, {"state": "RUNNING"})[REQUEUE].startswith("the job is RUNNING, not ended")
    opener = Opener(SlurmStub("4", "FAILED"))
    done = control.perform(reg, stopped, REQUEUE, opener, "from a test")
    assert (done.status, done.said) == (Status.REFUSED, f"job 4 was not requeued: {why}")
    assert [argv for argv in opener.runner.sent if argv[:2] == ["scontrol", "requeue"]] == []
