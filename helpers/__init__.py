"""Helpers for the "Is it actually faster?" Apache TVM course.

Import the module you need, e.g. ``from helpers import models, build, timing``.
Each module has one job: machine (targets), models (load and import), build
(compile and run), timing, ir (inspection), profiling, tuning, plotting,
envcheck (Day 0), grading (the instructor's nbgrader pipeline).
"""

__version__ = "0.1.0"
