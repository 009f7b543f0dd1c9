"""The contract layer: every shared word defined once, and the places that must spell it agree."""

import ast
import os
import re
import subprocess
import typing
from pathlib import Path

from slurmgen.contract import backends, envvars, ports, states, strategies, warm
from slurmgen.coordinator.models import GroupConfig
from slurmgen.generate.render import launch_script
from slurmgen.generate.spec import JobSpec, choices, default
from slurmgen.generate.specfile import build_spec
from slurmgen.train.config import TrainConfig

ROOT = Path(__file__).resolve().parents[3]


def test_the_contract_imports_nothing_of_slurmgen_but_itself():
    for path in (ROOT / "slurmgen" / "contract").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            for name in names:
                assert not name.startswith("slurmgen") or name.startswith("slurmgen.contract"), (path.name, name)


def test_every_slurmgen_variable_used_anywhere_is_declared():
    used = set()
    for path in [*(ROOT / "slurmgen").rglob("*.py"), *(ROOT / "templates").glob("*.j2")]:
        used |= set(re.findall(r"\bSLURMGEN_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()))
    # Not environment variables: the node link's here-document delimiter and the probe's line tag.
    used -= {"SLURMGEN_LINK_AGENT", "SLURMGEN_PROBE"}
    assert sorted(used - set(envvars.VARS)) == []
    assert sorted(set(envvars.VARS) - used) == []


def test_literal_choices_match_the_contract():
    """Validators and type checkers need literal types; they list exactly the contract's choices."""
    assert choices(JobSpec, "backend") == backends.BACKENDS
    assert typing.get_args(GroupConfig.model_fields["backend"].annotation) == backends.BACKENDS
    assert choices(JobSpec, "strategy") == strategies.STRATEGIES
    assert typing.get_args(GroupConfig.model_fields["strategy"].annotation) == strategies.STRATEGIES
    assert choices(JobSpec, "restart_mode") == warm.RESTART_MODES
    assert typing.get_args(GroupConfig.model_fields["restart_mode"].annotation) == warm.RESTART_MODES


def test_every_launcher_defaults_to_the_same_backend():
    """The coordinator said nccl where the spec and the trainer said auto: a CPU group then failed to start."""
    assert default(JobSpec, "backend") == GroupConfig.model_fields["backend"].default == backends.DEFAULT_BACKEND
    assert (
        default(JobSpec, "strategy")
        == GroupConfig.model_fields["strategy"].default
        == TrainConfig().strategy
        == strategies.DEFAULT_STRATEGY
    )


def test_job_port_is_stable_in_range_and_said_as_computed():
    assert ports.job_port("123456") == ports.JOB_PORT_BASE + 3456
    assert all(20000 <= ports.job_port(j) < 30000 for j in range(0, 100000, 997))
    assert ports.JOB_PORT_RULE == "20000 + job id % 10000"


def test_the_link_port_rule_is_the_same_in_python_and_in_the_launcher():
    """doctor's probe said MASTER_PORT + 1 where the launcher took the port below 65535."""
    script = launch_script(build_spec({"nodes": 2}))
    (line,) = [ln.strip() for ln in script.splitlines() if ln.strip().startswith("link_port=${")]
    masters = (1, 29500, ports.MAX_PORT - 1, ports.MAX_PORT)
    probe = "".join(f"master_port={m}; {line}; echo $link_port\n" for m in masters)
    env = {k: v for k, v in os.environ.items() if k != envvars.LINK_PORT}
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True, env=env).stdout
    assert out.split() == [str(ports.link_port(m)) for m in masters] == ["2", "29501", "65535", "65534"]


def test_outside_words_map_both_ways():
    for word_of, back in (
        (states.HEARTBEAT_WORD, states.from_heartbeat),
        (states.RUN_RECORD_WORD, states.from_run_record),
    ):
        assert len(set(word_of.values())) == len(word_of)
        assert all(back(word) is state for state, word in word_of.items())
    assert states.from_heartbeat("done") is states.State.SUCCEEDED
    assert states.from_run_record("finished") is states.State.SUCCEEDED
    assert states.from_heartbeat("bogus") is None


def test_an_exit_code_means_one_state_everywhere():
    S = states.State
    assert [states.from_exit_code(c) for c in (0, 75, 1, 124, 143, None)] == [S.SUCCEEDED, S.PREEMPTED] + [S.FAILED] * 4
    # Every producer writes its format's word for it: a run record "finished", a heartbeat "done".
    from slurmgen.tracking.run import status_for_exit_code

    assert [status_for_exit_code(c) for c in (0, 75, 3)] == ["finished", "preempted", "failed"]


def test_slurms_words_split_into_live_and_ended_and_keep_the_exit_75_rule():
    assert states.SLURM_LIVE.isdisjoint(states.SLURM_ENDED)
    assert set(states.SLURM_STATE) <= states.SLURM_LIVE | states.SLURM_ENDED
    assert (
        states.from_slurm("FAILED", 75) is states.State.PREEMPTED
        and states.from_slurm("CANCELLED by 0") is states.State.STOPPED
    )
