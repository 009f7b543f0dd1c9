"""SSH for slurmgen: targets from flags and ~/.ssh/config (`target`, pure), passphrase-protected
keys unlocked once (`keys`), and authenticated connections that run commands (`connect`).
Only `keys` and `connect` import paramiko; other commands (doctor, submit --remote) reuse them
rather than opening their own SSH sessions. This `__init__` imports nothing, so `target` stays
cheap to import.
"""
