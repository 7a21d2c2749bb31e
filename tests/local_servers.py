"""Starting the course's servers on localhost for a test: waiting until one answers.

A free port for it: ``helpers.rpc_tuning.free_port``, the one the RPC cluster uses.
"""

from __future__ import annotations

import subprocess
import time
import urllib.request
from collections.abc import Callable

import pytest


def wait_until_serving(proc: subprocess.Popen, url: str, what: str, log: Callable[[], str] = lambda: "",
                       seconds: int = 60) -> None:
    """Poll ``url`` until it answers; fail the test, with the server's log, if ``proc`` exits or time runs out."""
    for _ in range(seconds * 2):
        if proc.poll() is not None:
            pytest.fail(f"{what} exited with {proc.returncode} before it served {url}:\n{log()[-3000:]}")
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"{what} did not serve {url} within {seconds} s:\n{log()[-3000:]}")
