"""`python -m slurmgen.train`: the bundled DDP trainer (see cli.py, or --help)."""

import sys

from slurmgen.train.cli import main

if __name__ == "__main__":
    sys.exit(main())
