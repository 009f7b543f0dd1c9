"""slurmgen for programs written against a training framework: callbacks that give a Lightning or
transformers program what the bundled trainer has (heartbeats and hang detection, the timeline
and goodput, stragglers, metrics for `slurmgen status` and the page's curves).

    from slurmgen.integrations.lightning import SlurmgenCallback      # Lightning's Trainer
    from slurmgen.integrations.transformers import SlurmgenCallback   # transformers' Trainer

Importing this package imports nothing: each framework's module imports its framework, and is
imported only by a program that names it. Accelerate needs no callback (the loop is the
program's own): `slurmgen.beat(step=..., loss=...)` in it, see docs/guides/accelerate.md.
Both callbacks speak through `report.Reporter`, which writes with `slurmgen.beat`'s writer and
`slurmgen.tracking`, so every rank beats and only rank 0 keeps metrics and the run record.
"""
