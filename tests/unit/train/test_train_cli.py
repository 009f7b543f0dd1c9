"""Flags of `python -m slurmgen.train`: defaults from the environment, one-line errors, exit 2."""

import subprocess
import sys

import pytest

from slurmgen.train.cli import main, parse
from slurmgen.train.config import EXIT_PREEMPTED, ConfigError, TrainConfig


def test_defaults():
    cfg, launch, nproc = parse([], {})
    assert cfg == TrainConfig()
    assert (launch.backend, launch.rank, nproc) == ("auto", None, 1)
    assert cfg.requeue is None and cfg.out_dir == "runs/train"


def test_environment_defaults():
    cfg, launch, _ = parse([], {"SLURMGEN_BACKEND": "gloo", "SLURMGEN_REQUEUE": "1", "SLURM_JOB_ID": "77"})
    assert launch.backend == "gloo" and cfg.requeue is True and cfg.out_dir == "runs/job-77"
    cfg, launch, _ = parse(["--backend", "nccl", "--no-requeue"], {"SLURMGEN_BACKEND": "gloo", "SLURMGEN_REQUEUE": "1"})
    assert launch.backend == "nccl" and cfg.requeue is False
    assert parse([], {"SLURMGEN_REQUEUE": "0"})[0].requeue is False


def test_flags_reach_the_config():
    cfg, launch, nproc = parse(
        [
            "--out-dir",
            "o",
            "--max-steps",
            "7",
            "--batch-size",
            "3",
            "--grad-accum",
            "2",
            "--lr",
            "0.5",
            "--dtype",
            "bfloat16",
            "--seed",
            "1",
            "--save-every",
            "2",
            "--keep-last",
            "1",
            "--resume",
            "never",
            "--eval-every",
            "3",
            "--model",
            "mlp",
            "--mlp-hidden",
            "16",
            "--nproc-per-node",
            "4",
            "--rank",
            "0",
            "--world-size",
            "1",
            "--master-port",
            "1234",
        ],
        {},
    )
    assert (cfg.out_dir, cfg.max_steps, cfg.batch_size, cfg.grad_accum, cfg.lr, cfg.dtype) == (
        "o",
        7,
        3,
        2,
        0.5,
        "bfloat16",
    )
    assert (cfg.seed, cfg.save_every, cfg.keep_last, cfg.resume, cfg.eval_every) == (1, 2, 1, "never", 3)
    assert (cfg.model, cfg.mlp_hidden, nproc, launch.rank, launch.world_size, launch.master_port) == (
        "mlp",
        16,
        4,
        0,
        1,
        1234,
    )


BAD = [
    (["--batch-size", "0"], "argument --batch-size: must be at least 1, got 0"),
    (["--batch-size", "many"], "argument --batch-size: expected an integer, got 'many'"),
    (["--lr", "fast"], "argument --lr: expected a number, got 'fast'"),
    (["--dtype", "float8"], "argument --dtype: invalid choice: 'float8'"),
    (["--backend", "mpi"], "argument --backend: invalid choice: 'mpi'"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--max-steps", "5", "--epochs", "2"], "--max-steps (5) and --epochs (2) exclude each other"),
    (["--n-embd", "30", "--n-head", "4"], "--n-embd (30) must be a multiple of --n-head (4)"),
    (["--dropout", "1.5"], "--dropout must be in [0, 1) (got 1.5)"),
    (["--train-data", "/nonexistent/train.bin"], "argument --train-data: no such file: '/nonexistent/train.bin'"),
]


@pytest.mark.parametrize("argv,message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_flag_is_one_line_and_exit_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("slurmgen train: error: ") and message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_backend_from_environment_is_checked(monkeypatch, capsys):
    monkeypatch.setenv("SLURMGEN_BACKEND", "mpi")
    assert main([]) == 2
    assert "SLURMGEN_BACKEND must be auto, nccl or gloo (got 'mpi')" in capsys.readouterr().err


def test_nproc_per_node_under_a_launcher_is_refused(monkeypatch, capsys):
    for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "x", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(k, v)
    assert main(["--nproc-per-node", "2"]) == 2
    assert "--nproc-per-node 2 cannot be used when env already started 2 processes" in capsys.readouterr().err


def test_bad_launch_environment_is_exit_2(monkeypatch, capsys):
    for k, v in {"RANK": "5", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "x", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(k, v)
    assert main(["--nproc-per-node", "2"]) == 2
    assert "RANK=5 is not below WORLD_SIZE=2" in capsys.readouterr().err


def test_help_documents_flags_and_the_preemption_exit_code(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for flag in (
        "--out-dir",
        "--max-steps",
        "--epochs",
        "--batch-size",
        "--grad-accum",
        "--lr",
        "--dtype",
        "--backend",
        "--seed",
        "--save-every",
        "--keep-last",
        "--resume",
        "--eval-every",
        "--model",
        "--n-layer",
        "--train-data",
        "--val-data",
        "--nproc-per-node",
        "--init-timeout",
        "--tf32",
        "--requeue",
        "--master-addr",
    ):
        assert flag in out
    assert f"{EXIT_PREEMPTED} preempted" in out and "SLURMGEN_BACKEND" in out


def test_config_from_dict_rejects_unknown_keys():
    with pytest.raises(ConfigError) as info:
        TrainConfig.from_dict({"batchsize": 3})
    assert "unknown config key 'batchsize'" in str(info.value)
    with pytest.raises(ConfigError) as info:
        TrainConfig(batch_size=0, keep_last=0).validate()
    assert len(info.value.problems) == 2


def test_importing_and_parsing_leaves_torch_alone():
    code = (
        "import sys, slurmgen.train, slurmgen.train.cli as c; c.parse(['--max-steps', '3'], {}); "
        "assert 'torch' not in sys.modules, 'torch imported'; "
        "assert callable(slurmgen.train.__getattr__); print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_lazy_public_names():
    import slurmgen.train as t

    assert t.TrainConfig is TrainConfig and t.EXIT_PREEMPTED == 75
    assert callable(t.train_ddp) and callable(t.finish) and t.Trainer.__name__ == "Trainer"
    with pytest.raises(AttributeError):
        _ = t.no_such_name


def test_every_flag_is_a_field_laid_out_once_with_the_fields_default():
    """The parser is built from the fields: each flagged field appears once in --help, and with
    no flag and no environment the parse gives the field's own default (nothing to drift)."""
    import dataclasses

    from slurmgen.train.cli import LAYOUT, flag_fields
    from slurmgen.train.env import LaunchFlags

    laid_out = [name for _, names in LAYOUT for name in names]
    assert sorted(laid_out) == sorted(flag_fields()) and len(set(laid_out)) == len(laid_out)
    unflagged = {f.name for f in dataclasses.fields(TrainConfig)} - set(flag_fields())
    assert unflagged == {"beta1", "beta2", "extra"}  # the Python API's only
    cfg, launch, _ = parse([], {})
    for cls, parsed in ((TrainConfig, cfg), (LaunchFlags, launch)):
        for f in dataclasses.fields(cls):
            if f.name in flag_fields():
                assert getattr(parsed, f.name) == f.default, f.name
