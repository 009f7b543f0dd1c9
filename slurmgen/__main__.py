"""`python -m slurmgen` is the same as the `slurmgen` console script."""

from slurmgen.cli import main

if __name__ == "__main__":
    main()
