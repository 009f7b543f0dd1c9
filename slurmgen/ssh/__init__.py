"""SSH for slurmgen: targets from flags and ~/.ssh/config (`target`, pure), passphrase-protected
keys unlocked once (`keys`), host keys checked against known_hosts (`hostkeys`), errors as one
line per host (`explain`), jump hosts shared by the targets behind them (`jumps`), and
authenticated connections that run commands (`connect`: `connect_all`, `Connection.start`).
paramiko is imported through `lean` (without its optional invoke), by those modules only;
other commands (doctor, submit --remote) reuse `connect` rather than opening their own SSH
sessions. This `__init__` imports nothing, so `target` stays cheap to import.
"""
