"""Capture stderr, Python's and the C++ libraries' (file descriptor 2): TVM logs straight to it.

A leaf of its own: exporting a library (``export``, the compile ``cache``) and profiling with
PyTorch's profiler (``dispatch``) all hold TVM's log lines away from a notebook's stderr, which
nbgrader scores as a failure. Day 3 keeps the warnings of failed builds out of its cells with it;
Days 6, 13 and 14 use it as ``export.capture_stderr``.

Introduced on Day 3.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile
from dataclasses import dataclass


@dataclass
class Captured:
    """What was written to stderr inside ``capture_stderr()`` (filled in when the block ends)."""

    text: str = ""

    @property
    def lines(self) -> list[str]:
        return [line for line in self.text.splitlines() if line.strip()]


@contextlib.contextmanager
def capture_stderr():
    """Capture stderr, Python's *and* the C++ library's (file descriptor 2).

    TVM's C++ code logs warnings straight to file descriptor 2 (for example
    ``export_library`` in 0.27 logs ``Scope Saving:``), which Python's
    ``contextlib.redirect_stderr`` cannot see. In Jupyter such lines show up as
    red stderr output, and nbgrader scores a test cell with any stderr as 0.
    """
    captured = Captured()
    python_err = io.StringIO()
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            with contextlib.redirect_stderr(python_err):
                yield captured
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            captured.text = tmp.read().decode(errors="replace") + python_err.getvalue()
