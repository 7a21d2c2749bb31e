"""A day as an instructor or a learner types it (``3``, ``03``, ``day03``, ``day03_build``), read one way
by every command that takes one: ``make check``, ``make student``, ``make handout``, ``make import``.

It imports nothing of the course, so that ``grading`` itself can read a day with it.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import GradingError


def day_name(day: str, known: Sequence[str], command: str = "make check") -> str:
    """The folder name in ``known`` that ``day`` means; a day that is none of them is refused with the days
    there are, shown as ``command DAY=3`` would take them."""
    text = str(day).strip()
    number = text[3:5] if text.startswith("day") else text
    if number.isdigit():
        matches = [name for name in known if name.startswith(f"day{int(number):02d}_")]
        if matches:
            return matches[0]
    if text in known:
        return text
    raise GradingError(f"There is no day {day!r}: give its number ({command} DAY=3) or its name ({', '.join(known)}).")
