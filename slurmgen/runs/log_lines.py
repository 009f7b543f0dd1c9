"""How a rank's log divides into lines, for every reader of one: `slurmgen logs`, the run page's
log view and `slurmgen launch`'s display.

A line ends at "\\n" only. A progress bar (tqdm, and through it Lightning's and transformers')
redraws itself in place: each update starts with "\\r" and none ends with "\\n" until the bar
closes, so the whole bar, and whatever the program wrote after it before the next newline (a
warning, say), is one line. `str.splitlines()` also cuts at "\\r" (and at form feeds and a few
Unicode separators): the label that srun and the rank wrapper put at the start of a line would
stay with its first piece only, and every later piece would belong to no rank.

Shown, a line is what a terminal would leave of it: its last "\\r" segment with something in it,
the bar's final state and what followed it. The earlier updates are the same bar at smaller
counts, which a terminal overwrote too; a segment of blanks only is a bar clearing itself
(tqdm's leave=False), after which the next text is what the terminal shows.
"""

from __future__ import annotations


def log_lines(text: str) -> list[str]:
    """`text` cut at its newlines only; a final newline ends the last line (no empty line after it)."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


def shown(text: str) -> str:
    """The text of one line (labels already taken off) as a terminal would leave it (see above)."""
    if "\r" not in text:
        return text
    return next((part for part in reversed(text.split("\r")) if part.strip()), "")
