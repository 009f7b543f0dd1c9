"""Where the time of a run goes: the heartbeat and timeline protocols (written by any program,
stdlib only) and the pure functions that read them (timeline, stragglers, goodput).

Writers: `heartbeat.Heartbeat` (the bundled trainer and `slurmgen.beat`, one implementation)
and `timeline_writer.TimelineWriter`. Readers, pure: `timeline`, `stragglers`, `goodput`. Nothing here
imports torch, and the writers import nothing but the contract: every rank imports them.
"""
