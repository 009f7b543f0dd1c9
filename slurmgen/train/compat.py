"""Which torch versions the trainer runs on, checked once per rank before the process group.

pip enforces the declared floor of the `train` extra (the version CI tests, see the README's
"Which torch" section). A site-provided torch installed outside pip may be older: below
`MINIMUM` the trainer cannot run (`init_process_group(device_id=...)` and
`torch.amp.GradScaler(device)` appear in 2.3) and says so in one line; between `MINIMUM` and
`TESTED` it runs with a warning; and it warns about versions with a known bug in an API it uses.
"""

from __future__ import annotations

import re

MINIMUM = (2, 3)  # device_id in init_process_group, torch.amp.GradScaler(device)
TESTED = (2, 13)  # what CI installs (scripts/setup.sh) and pyproject's train extra declares
# init_process_group(device_id=...) may hang in these (pytorch/pytorch#153960); CUDA runs only.
DEVICE_ID_HANG = ((2, 6, 1), (2, 7, 1))


def _parse(version: str) -> tuple[int, int, int]:
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    if not m:
        return (0, 0, 0)
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def check(version: str, cuda: bool) -> tuple[str | None, str | None]:
    """(error, warning) about running on torch `version`; both None when it is a tested one."""
    v = _parse(version)
    if v[:2] < MINIMUM:
        return (
            f"torch {version} is too old for slurmgen.train: it needs torch >= {'.'.join(map(str, MINIMUM))} "
            f"(tested: {'.'.join(map(str, TESTED))}): pip install 'slurmgen[train]'"
        ), None
    if cuda and DEVICE_ID_HANG[0] <= v < DEVICE_ID_HANG[1]:
        return None, (
            f"torch {version} may hang in init_process_group(device_id=...) (pytorch/pytorch#153960): "
            "use torch 2.7.1 or later"
        )
    if v[:2] < TESTED:
        return (
            None,
            f"torch {version} is older than the tested {'.'.join(map(str, TESTED))}: "
            "it should work, but CI does not run it",
        )
    return None, None
