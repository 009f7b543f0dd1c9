"""The contract: the words every part of slurmgen shares, and nothing else.

Exit codes, the `SLURMGEN_*` environment variables, port rules, the vocabulary of run states
and the sweep grid live here, each defined once. This package imports nothing of slurmgen
(and nothing heavy): every rank, the node bootstrap and `slurmgen --help` import it, and every
other package takes its constants from here instead of spelling them again.
"""
