"""The run registry, shared by every command that starts or shows a run: one SQLite file of runs
(`registry.py`), one model of a run whatever started it (`model.py`: a Slurm job, an SSH launch,
a coordinator group), the stop channel of a running launch (`stop_request.py`) and where the
bundled trainer keeps a run's records (`trainer_records.py`) and how a rank's log divides into
lines for every reader of one (`log_lines.py`). A service below the features:
jobs/, launch/ and the coordinator's pages stand on it, and it imports none of them. Nothing here
runs Slurm or SSH (that is jobs/ and slurmgen.ssh), and this `__init__` imports nothing.
"""
