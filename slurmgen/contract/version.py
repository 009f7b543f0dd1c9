"""slurmgen's version, written once: the package's `__version__`, the header of every generated
script, the node bootstrap and the coordinator's health answer all take it from here."""

VERSION = "0.1.0"
