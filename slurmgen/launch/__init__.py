"""`slurmgen launch`: start a job's ranks on hosts you can SSH to, watch them, fail as one.

`plan` decides before any connection what runs where (hosts, ranks, environment); `remote`
is what each node runs and how it gets there; `display` turns node output into prefixed lines
and the final summary; `fanout` connects, starts every node and decides the verdict. The SSH
layer lives in `slurmgen.ssh` (the only place that imports paramiko), so importing this
package or `plan` costs nothing for commands that only render scripts.
"""
