"""One retry rule: run_slurm.sh's requeue, `slurmgen launch --max-restarts` and a coordinator
group's restarts ask contract/retries.py which ended attempt is worth another."""

import subprocess

from slurmgen.contract import exitcodes, retries
from slurmgen.generate.render import render
from slurmgen.generate.specfile import build_spec


def test_success_bad_input_preemption_and_a_stop_are_never_retried():
    assert [retries.worth_retry(c) for c in (exitcodes.FAILED, exitcodes.HUNG, exitcodes.LOST, 139, None)] == [True] * 5
    assert not any(retries.worth_retry(c) for c in (exitcodes.OK, exitcodes.BAD_INPUT, exitcodes.PREEMPTED))
    assert not retries.worth_retry(exitcodes.TERMINATED, stopped=True)
    assert [retries.worth_retry(c, retry_on=[3, 124]) for c in (3, 124, 1, exitcodes.LOST)] == [
        True,
        True,
        False,
        False,
    ]


def test_run_slurm_requeues_exactly_the_codes_the_rule_retries():
    """The requeue branch of the rendered script, run for every exit code, against worth_retry."""
    spec = build_spec({"retries": 2, "retry_on": "1,3,124,143,255"})
    script = render(spec).files["run_slurm.sh"]
    (test,) = [ln.strip() for ln in script.splitlines() if '*" $status "*' in ln]
    condition = test.removeprefix("elif ").removesuffix("; then")
    probe = (
        f'for status in {{0..255}}; do if ((status != {exitcodes.OK})) && {condition}; then echo "$status"; fi; done'
    )
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True).stdout
    assert [int(c) for c in out.split()] == [c for c in range(256) if retries.worth_retry(c, retry_on=spec.retry_on)]
    assert out.split() == ["1", "3", "124", "143", "255"]
