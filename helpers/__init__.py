"""Helpers for the "Is it actually faster?" Apache TVM course.

Import the module you need, e.g. ``from helpers import models, build, timing``.
Each module has one job: machine (targets), models (load and import), build
(compile and run), timing, ir (inspection), profiling, tuning, plotting,
envcheck (Day 0), grading (the instructor's nbgrader pipeline).
"""

import os

# TVM pins its pool's threads to cores. In one process with PyTorch, whose own threads then queue
# behind them, that made a PyTorch conv2d take 16 ms instead of 0.3 ms right after a parallel TVM
# kernel on 2 cores, and a pinned TVM worker stalls on a core another program keeps busy. The
# course runs both libraries side by side, so pinning is off unless the learner sets it.
os.environ.setdefault("TVM_BIND_THREADS", "0")

__version__ = "0.1.0"
