"""Rendered scripts: golden files, bash -n and shellcheck over many configurations."""

import itertools
import os
import re
import subprocess
from pathlib import Path

import pytest
from helpers import ODD_ARGUMENTS

from slurmgen.generate.render import LAUNCH_SCRIPT, SLURM_SCRIPT, render
from slurmgen.generate.specfile import build_spec, spec_from_sources

GOLDEN = Path(__file__).parent / "golden"
EXAMPLES = Path(__file__).resolve().parents[3] / "examples"

GOLDEN_SPECS = {
    "default": {},
    "nccl_2x4": {
        "nodes": 2,
        "gpus": 4,
        "backend": "nccl",
        "time": "2-00:00:00",
        "partition": "gpu",
        "account": "proj1",
        "cpus_per_task": 8,
        "mem": "480G",
        "exclusive": True,
        "env": {"NCCL_DEBUG": "WARN", "NCCL_IB_HCA": "mlx5"},
        "setup": ["module load cuda/12.4"],
        "requeue": True,
        "signal_lead": 300,
        "sbatch_extra": ["--mail-type=END,FAIL"],
    },
    "torchrun_gres": {
        "nodes": 3,
        "gpus": 2,
        "launcher": "torchrun",
        "gpu_request": "gres",
        "cpus_per_task": 4,
        "master_port": 29400,
    },
    "gloo_override": {
        "nodes": 2,
        "gpus": 2,
        "backend": "gloo",
        "master_addr": "10.0.0.1",
        "master_port": 23456,
        "command": ["python", "-m", "slurmgen.train.probe"],
    },
    "pyxis": {
        "nodes": 2,
        "gpus": 8,
        "container": {"image": "nvcr.io#nvidia/pytorch:24.05-py3", "mounts": ["/data:/data:ro", "/scratch:/scratch"]},
    },
    "apptainer_torchrun": {
        "launcher": "torchrun",
        "container": {"image": "/images/torch.sif", "runtime": "apptainer", "mounts": ["/data:/data"]},
    },
    "request_fields": {
        "nodes": 2,
        "gpus": 4,
        "gpu_request": "gres",
        "gpu_type": "a100",
        "mem_per_gpu": "40G",
        "time": "2-00",
        "time_min": "12:00:00",
        "reservation": "maint",
        "nodelist": "gpu[01-02]",
        "exclude": "gpu[07,09]",
    },
    "healing": {
        "nodes": 4,
        "gpus": 8,
        "heartbeat_timeout": 300,
        "retries": 2,
        "retry_on": "1,124,143",
        "exclude_failed_node": True,
        "preflight": True,
        "log_dir": "logs of 'run' $1",
    },
    "chain": {"chain": 3, "time": "1-00", "retries": 1, "retry_on": "1,124"},
    "restarts_spare": {
        "nodes": 2,
        "gpus": 4,
        "restarts": 3,
        "spare_nodes": 1,
        "heartbeat_timeout": 60,
        "retries": 1,
        "retry_on": "1,124,137",
    },
    "restarts_torchrun": {"nodes": 2, "gpus": 2, "launcher": "torchrun", "restarts": 2, "master_port": 29400},
    # warm restarts (templates/run_slurm_warm.sh.j2): the step outlives a failed rank, which starts anew alone
    "restarts_warm": {"nodes": 2, "gpus": 2, "restarts": 2, "restart_mode": "warm"},
    "bind_torchrun": {"nodes": 2, "gpus": 2, "launcher": "torchrun", "bind": "cores"},
    # A smaller world: a lost node with no spare left drops out while 2 of the 3 nodes are left.
    "restarts_min_nodes": {
        "nodes": 3,
        "gpus": 2,
        "restarts": 2,
        "min_nodes": 2,
        "heartbeat_timeout": 60,
        "retries": 1,
        "retry_on": "1,124,137",
    },
}


def _matrix():
    """At least 30 distinct configurations crossing every switch that changes the text."""
    containers = [
        None,
        {"image": "nvcr.io#nvidia/pytorch:24.05-py3", "mounts": ["/d:/d"]},
        {"image": "img.sif", "runtime": "apptainer", "mounts": ["/d:/d"]},
    ]
    for i, (launcher, backend, gpu_request, container, requeue, master) in enumerate(
        itertools.product(
            ["srun", "torchrun"], ["auto", "gloo"], ["auto", "gres"], containers, [False, True], [None, "10.1.2.3"]
        )
    ):
        yield (
            f"m{i:02d}",
            {
                "nodes": 1 + i % 4,
                "gpus": 1 + i % 8,
                "launcher": launcher,
                "backend": backend,
                "gpu_request": gpu_request,
                "container": container,
                "requeue": requeue,
                "master_addr": master,
                "time": "1-00" if requeue else None,
                "setup": ["source venv/bin/activate"] if i % 3 == 0 else [],
                "env": {"NCCL_DEBUG": "INFO", "WEIRD": 'it\'s $(x) `y` "z" # w\nv', "HOME_DATA": "~/data", "BS": "a\\"}
                if i % 2
                else {},
                "job_name": "job 'q' $(x) #1" if i % 5 == 0 else "run",
                "command": ["python", "train.py", "--note", "a b; $(rm -rf /) `x` 'y' \"z\" #", *ODD_ARGUMENTS]
                if i % 2
                else ["python", "-m", "x"],
                "heartbeat_timeout": 2.5 if i % 4 == 1 else None,
                "preflight": i % 4 == 3,
                "bind": ("none", "auto", "cores", "numa")[i % 4],
                **(
                    {"retries": 1 + i % 3, "retry_on": [1, 124], "exclude_failed_node": i % 2 == 0}
                    if i % 3 == 2
                    else {}
                ),
                **({"chain": 2 + i % 3, "time": "2:00:00"} if not requeue and i % 3 != 0 else {}),
                **({"restarts": 1 + i % 3, "spare_nodes": i % 2, "min_nodes": 1 + i % 8 // 5} if i % 4 == 1 else {}),
            },
        )


MATRIX = dict(_matrix())


def test_matrix_is_large():
    assert len(MATRIX) >= 30


@pytest.mark.parametrize("name", sorted(GOLDEN_SPECS))
def test_golden(name):
    """Renders are deterministic and match the reviewed files (SLURMGEN_UPDATE_GOLDEN=1 rewrites)."""
    files = render(build_spec(GOLDEN_SPECS[name])).files
    for file_name in (SLURM_SCRIPT, LAUNCH_SCRIPT):
        golden = GOLDEN / f"{name}.{file_name}"
        if os.environ.get("SLURMGEN_UPDATE_GOLDEN"):
            golden.write_text(files[file_name])
        assert files[file_name] == golden.read_text(), f"{golden} differs"
    assert render(build_spec(GOLDEN_SPECS[name])).files == files


@pytest.fixture(scope="module")
def rendered_matrix(tmp_path_factory):
    root = tmp_path_factory.mktemp("matrix")
    paths = []
    specs = {
        name: build_spec({k: v for k, v in values.items() if v is not None})
        for name, values in {**MATRIX, **GOLDEN_SPECS}.items()
    }
    specs.update({f"example_{p.stem}": spec_from_sources(p, {}) for p in EXAMPLES.glob("*.yaml")})
    for name, spec in specs.items():
        files = render(spec).files
        for file_name in (SLURM_SCRIPT, LAUNCH_SCRIPT):
            path = root / f"{name}.{file_name}"
            path.write_text(files[file_name])
            paths.append(path)
    return paths


def test_bash_syntax(rendered_matrix):
    for path in rendered_matrix:
        result = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert result.returncode == 0, f"{path.name}: {result.stderr}"


DIGEST_IN_HEADER = re.compile(r"^# Generated by slurmgen \S+ from job spec ([0-9a-f]{12}) ", re.M)


def distinct(paths: list[Path]) -> list[Path]:
    """One script of each text, the spec's digest and the opening comments aside. The digest is a hex
    word in comments and in a default value, read the same by shellcheck whatever its value; the
    comment lines before the first command are comments whatever they say (no string or here-document
    can hold them), so shellcheck reads only their directives, which stay. 230 rendered scripts: 177
    distinct texts with the digest aside, 150 with the opening comments too (27 launch scripts of
    ~1,200 lines differ only in their usage example's node and process counts)."""
    seen: dict[str, Path] = {}
    for path in paths:
        text = path.read_text()
        digest = DIGEST_IN_HEADER.search(text)
        text = text.replace(digest.group(1), "DIGEST") if digest else text
        lines = text.splitlines(keepends=True)
        opening = next((i for i, line in enumerate(lines) if not line.startswith("#")), len(lines))
        directives = [line for line in lines[:opening] if line.startswith("#!") or "shellcheck" in line]
        seen.setdefault("".join(directives + lines[opening:]), path)
    return list(seen.values())


def test_shellcheck_clean(rendered_matrix, shellcheck):
    # One shellcheck per core on a share of the matrix at once: shellcheck is single-threaded and takes
    # ~1 ms a line. Contiguous shares, so each has as many long launch scripts as short Slurm ones
    # (every other path is a launch script: split by [0::2], one share had them all and took twice as long).
    scripts = distinct(rendered_matrix)
    parts = len(os.sched_getaffinity(0))
    size = -(-len(scripts) // parts)
    shares = [scripts[i : i + size] for i in range(0, len(scripts), size)]
    procs = [
        subprocess.Popen([shellcheck, "--severity=style", *map(str, share)], stdout=subprocess.PIPE, text=True)
        for share in shares
    ]
    for proc in procs:
        out, _ = proc.communicate()
        assert proc.returncode == 0, out[-5000:]


def test_sbatch_header_matches_spec():
    text = render(build_spec(GOLDEN_SPECS["nccl_2x4"])).files[SLURM_SCRIPT]
    header = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    assert header == [
        "#SBATCH --job-name=slurmgen",
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=4",
        "#SBATCH --cpus-per-task=8",
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --mem=480G",
        "#SBATCH --time=2-00:00:00",
        "#SBATCH --partition=gpu",
        "#SBATCH --account=proj1",
        "#SBATCH --output=out/logs/%x-%j.out",
        "#SBATCH --open-mode=append",
        "#SBATCH --exclusive",
        "#SBATCH --requeue",
        "#SBATCH --signal=USR2@300",
        "#SBATCH --mail-type=END,FAIL",
    ]


def test_torchrun_mode_runs_one_task_per_node_with_all_cpus():
    text = render(build_spec(GOLDEN_SPECS["torchrun_gres"])).files[SLURM_SCRIPT]
    assert "#SBATCH --ntasks-per-node=1\n" in text
    assert "#SBATCH --cpus-per-task=8\n" in text  # 4 per process x 2 processes
    assert "#SBATCH --gres=gpu:2\n" in text
    assert "--rdzv-backend=c10d" in text and '--rdzv-id="$SLURM_JOB_ID"' in text
    assert "--nproc-per-node=2" in text


def test_spares_are_asked_for_and_a_restarting_job_survives_a_node():
    """--spare-nodes K: sbatch asks for nodes + K, with --no-kill (a node's failure ends a step,
    not the job); the steps run on `nodes` of them at first (srun --nodes, --ntasks, as many as
    step_nodes holds: fewer in a smaller world, --min-nodes)."""
    script = render(build_spec({"nodes": 2, "gpus": 4, "restarts": 1, "spare_nodes": 1})).files["run_slurm.sh"]
    assert "#SBATCH --nodes=3\n" in script and "#SBATCH --no-kill\n" in script
    assert '"${step_where[@]}" --overlap --ntasks=$((step_size * 4)) bash -c' in script
    assert "step_size=${#step_nodes[@]}\n" in script
    assert 'step_nodes=("${job_hosts[@]:0:2}")' in script
    plain = render(build_spec({"nodes": 2, "gpus": 4})).files["run_slurm.sh"]
    assert "#SBATCH --nodes=2\n" in plain and "--no-kill" not in plain and "step_where" not in plain


def test_gloo_requests_no_gpus_and_no_nccl_settings():
    text = render(build_spec({"backend": "gloo"})).files[SLURM_SCRIPT]
    assert "gpus-per-node" not in text and "--gres" not in text and "NCCL" not in text


def test_the_preempt_signal_reaches_sbatch_torchrun_and_the_trainer_alike():
    text = render(build_spec({"launcher": "torchrun", "requeue": True, "preempt_signal": "USR1"})).files[SLURM_SCRIPT]
    assert "#SBATCH --signal=USR1@120" in text and "export SLURMGEN_PREEMPT_SIGNAL=USR1" in text
    assert "export PET_SIGNALS_TO_HANDLE=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1" in text


@pytest.mark.parametrize(
    "fields, sbatch, trainer",
    [
        ({"requeue": False}, "#SBATCH --no-requeue", "export SLURMGEN_REQUEUE=0"),
        ({"requeue": True}, "#SBATCH --requeue", "export SLURMGEN_REQUEUE=1"),
        # Retries need a requeueable job for their own `scontrol requeue`; the trainer still must not requeue.
        ({"requeue": False, "retries": 2, "retry_on": [1]}, "#SBATCH --requeue", "export SLURMGEN_REQUEUE=0"),
        # Unset: the cluster's JobRequeue decides (PreemptMode=REQUEUE still brings the job back), and the
        # trainer requeues after the warning only if `scontrol show job` says the job is requeueable.
        ({}, None, "unset SLURMGEN_REQUEUE"),
    ],
)
def test_the_specs_requeue_reaches_sbatch_and_the_trainer(fields, sbatch, trainer):
    text = render(build_spec(fields)).files[SLURM_SCRIPT]
    header = [line for line in text.splitlines() if "requeue" in line and line.startswith("#SBATCH")]
    assert header == ([sbatch] if sbatch else []) and f"\n{trainer}\n" in text
    assert "export SLURMGEN_PREEMPT_SIGNAL=USR2\n" in text


def test_sbatch_values_are_quoted_for_sbatch():
    text = render(build_spec({"job_name": 'a b#c"d\\e'})).files[SLURM_SCRIPT]
    assert '#SBATCH --job-name="a b\\#c\\"d\\\\e"' in text


def test_torchrun_passes_the_requeue_warning_to_workers():
    text = render(build_spec({"launcher": "torchrun", "requeue": True})).files[SLURM_SCRIPT]
    assert "export PET_SIGNALS_TO_HANDLE=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR2" in text
    assert "export TORCHELASTIC_SIGNALS_TO_HANDLE=$PET_SIGNALS_TO_HANDLE" in text
    assert "TORCHELASTIC" not in render(build_spec({"launcher": "srun", "requeue": True})).files[SLURM_SCRIPT]


@pytest.mark.parametrize(
    "command, container, agent",
    [
        (["/opt/venv/bin/python", "train.py"], None, '"$1" -c "$agent_shim"'),
        (["python3.11", "-m", "pkg"], None, '"$1" -c "$agent_shim"'),
        (["./train.sh"], None, "torchrun"),
        (["python", "train.py"], {"image": "t.sif", "runtime": "apptainer"}, "torchrun"),  # python is in the image
    ],
)
def test_torchrun_mode_runs_the_programs_own_python(command, container, agent):
    text = render(build_spec({"launcher": "torchrun", "command": command, "container": container})).files[SLURM_SCRIPT]
    assert f"  agent=({agent})\n" in text and '  exec "${agent[@]}" --nnodes=' in text


def test_srun_gets_the_cpus_per_task_that_sbatch_got():
    text = render(build_spec({"cpus_per_task": 4})).files[SLURM_SCRIPT]
    assert 'srun_args+=(--cpus-per-task="$SLURM_CPUS_PER_TASK")' in text


def test_the_specs_strategy_reaches_the_trainer_under_both_launch_scripts():
    from slurmgen.train.cli import parse

    files = render(build_spec({"strategy": "fsdp"})).files
    for name in (SLURM_SCRIPT, LAUNCH_SCRIPT):
        assert "\nexport SLURMGEN_STRATEGY=fsdp\n" in files[name]
    assert "\nexport SLURMGEN_STRATEGY=ddp\n" in render(build_spec({})).files[SLURM_SCRIPT]
    assert parse([], {"SLURMGEN_STRATEGY": "fsdp"})[0].strategy == "fsdp"
    assert parse(["--strategy", "ddp"], {"SLURMGEN_STRATEGY": "fsdp"})[0].strategy == "ddp"
    assert parse([], {})[0].strategy == "ddp"


def test_the_timeline_function_is_one_text_in_both_scripts():
    """launch_multi_node.sh and run_slurm.sh's rank wrapper write a rank's timeline lines with
    the same function, rendered from templates/timeline.sh.j2 (it was written twice)."""
    files = render(build_spec({"launcher": "srun"})).files

    def function(text: str) -> str:
        found = re.search(r"^( *)timeline\(\) \{\n.*?^\1\}$", text, re.M | re.S)
        assert found, "no timeline function"
        return "\n".join(line.removeprefix(found[1]) for line in found[0].splitlines())

    assert function(files[LAUNCH_SCRIPT]) == function(files[SLURM_SCRIPT])
    template = (Path(__file__).resolve().parents[3] / "templates" / "timeline.sh.j2").read_text()
    assert function(files[LAUNCH_SCRIPT]) in template
    assert "'" not in template  # it sits inside the rank wrapper's single quotes
