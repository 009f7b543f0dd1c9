"""A job's life after rendering: submit, follow, stop, and sweeps as one array job.

`submit` renders exactly as `create` does and calls `sbatch --parsable`; every job lands in the
run registry (slurmgen.runs: beside launches and coordinator groups, one run model;
`listing.py` is `slurmgen jobs`) so that `jobs`, `status`, `logs` and `cancel` can find it
again by id, array task, name or output directory (`resolve.py`). Slurm is asked through its
plain command-line tools, here or over one SSH connection to a login node (`slurm_runner.py`,
`remote.py`, which also ships content-addressed code snapshots from `snapshot.py`). What they
print is parsed by pure functions (`slurm.py`) tested on recorded output of Slurm 22.05, where
`scontrol show job -o` is the source that always works (no accounting needed) and
`sacct --parsable2`, where there is accounting, adds the steps of the job `status` shows and
fills in jobs the controller has forgotten (`query.py`). `view.py`
puts one job's status together; `commands.py` does each command's work and `cli.py` its flags.
A run's controls (cancel, checkpoint and stop, requeue, stop a launch) are one entry, `control.py`,
which `cancel`, the run page's forms and the JSON API call alike.
Sweeps (`sweep.py`) are a spec field: the grid becomes one `#SBATCH --array` script whose task
N appends row N's arguments to the command. Nothing here imports torch or paramiko at import
time, and `status` does not load the renderer.
"""
