"""Errors the course raises on bad input.

Every message says what was wrong and what to do about it, so a learner (or the
grader's feedback) can act on it without reading a traceback.

Introduced on Day 14.
"""


class CourseError(Exception):
    """Base class: bad input to a course helper."""


class UnknownModelError(CourseError, KeyError):
    """A model name the course does not know."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class InputShapeError(CourseError, ValueError):
    """An input tensor with the wrong shape or dtype for the model."""


class NoGPUError(CourseError, RuntimeError):
    """A GPU was asked for on a machine that has none."""


class TuningDatabaseError(CourseError, FileNotFoundError):
    """A tuning database that is missing or does not fit the module or target."""


class ParityError(CourseError, AssertionError):
    """A compiled model whose output differs from PyTorch's beyond the tolerance."""


class GradingError(CourseError, RuntimeError):
    """An instructor command that cannot run as asked; the message says what to run first."""


class ExportError(CourseError, RuntimeError):
    """torch.export could not capture a model on its example input, for a reason other than its shape."""
