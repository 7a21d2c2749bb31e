"""How autograde runs a submission: a learner's mistake costs only its own points, whatever it does.

nbgrader's ``Execute`` already scores an exception or a cell past its time limit as a failure of that
cell. Three things it does not do, and this preprocessor (``CourseExecute``, in nbgrader_config.py and
the hub's config in its place) adds:

* **A kernel that dies** (a crash, ``os._exit``, a segfault in a compiled kernel, memory exhausted) made
  nbgrader delete the whole autograded notebook: no feedback, every exercise scored 0. Here the cell that
  killed it gets an error saying so, a new kernel runs the cells above it again (their first outputs are
  kept), and grading goes on: the exercises that do not need that cell keep their points.
* **A cap per notebook** (``notebook_timeout``) beside the cap per cell: a loop reached from many cells
  costs at most this long; the cells left are not run, and each says why.
* **A cap on each kernel's memory** (``kernel_memory_gb``, the data a kernel may allocate): a learner's
  runaway allocation gets a MemoryError, or kills its own kernel, instead of the grading machine.
* **Messages that say the limit**: a cell past its limit says "your code ran past N s", not an empty
  error, and each graded cell's start is logged with the student and the time so far.
"""

from __future__ import annotations

import copy
import resource
import time
from contextlib import contextmanager

from jupyter_client.utils import run_sync
from nbclient.exceptions import DeadKernelError
from nbclient.util import ensure_async
from nbformat.notebooknode import NotebookNode
from nbgrader.converters import Autograde
from nbgrader.preprocessors import Execute
from traitlets import Integer

from .stops import KERNEL_DIED, NOT_RUN, PROGRESS


def error(ename: str, evalue: str) -> NotebookNode:
    """An error output as nbgrader scores and feedback shows one (red name, then the message)."""
    return NotebookNode(output_type="error", ename=ename, evalue=evalue, traceback=[f"\x1b[0;31m{ename}\x1b[0m: {evalue}"])


class CourseExecute(Execute):
    """nbgrader's Execute, surviving a dead kernel, with a cap per notebook and limits said in the messages."""

    notebook_timeout = Integer(
        3600, help="Seconds one notebook may run in all; the cells left after it are not run, and fail.",
    ).tag(config=True)
    kernel_memory_gb = Integer(
        8, help="Gigabytes of data one kernel may allocate (RLIMIT_DATA), so that a runaway cell cannot take the machine.",
    ).tag(config=True)

    def preprocess(self, nb, resources=None, km=None):
        self._started = time.monotonic()
        who = (resources or {}).get("nbgrader", {})
        self._who = f"{who.get('student', '?')}/{who.get('assignment', '?')}"
        # (nbclient makes the timed-out cell's error output from this dict: the output's fields but its type)
        self.error_on_timeout = {k: v for k, v in error("CellTimeoutError", self.timeout_message()).items() if k != "output_type"}
        return super().preprocess(nb, resources, km)

    def timeout_message(self) -> str:
        return (f"your code ran past {self.timeout} s, the time limit of one cell: an endless loop, or far more work "
                "than the exercise asks. The cell was stopped and scores nothing; the other cells were graded.")

    def preprocess_cell(self, cell, resources, index):
        elapsed = time.monotonic() - self._started
        if cell.cell_type != "code":
            return cell, self.resources
        if elapsed > self.notebook_timeout:
            self.log.warning("%s%s: cell %d not run: past the notebook's %d s", PROGRESS, self._who, index, self.notebook_timeout)
            cell.outputs = [error(NOT_RUN, f"not run: this notebook reached its time limit of {self.notebook_timeout} s "
                                           "in all before this cell. Make the slow cells above faster.")]
            return cell, self.resources
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if cell.metadata.get("nbgrader", {}).get("grade"):
            self.log.info("%s%s: %s at %.0f s", PROGRESS, self._who, grade_id, elapsed)
        try:
            return super().preprocess_cell(cell, resources, index)
        except DeadKernelError:
            self.log.warning("%s%s: the kernel died in cell %d%s; restarting it and running the cells above again",
                             PROGRESS, self._who, index, f" ({grade_id})" if grade_id else "")
            cell.outputs.append(error(KERNEL_DIED, (
                "the kernel died while this cell ran (a crash, os._exit, a segfault in compiled code, or memory "
                "exhausted). This cell scores nothing; a new kernel ran the cells above again, and the cells "
                "below were graded as usual.")))
            self._restart(index)
            return cell, self.resources

    def _restart(self, index: int) -> None:
        """A new kernel, with the state the cells before ``index`` leave (a cell that kills it again is skipped)."""
        run_sync(self._async_new_kernel)()
        for before, cell in enumerate(self.nb.cells[:index]):
            if cell.cell_type != "code" or any(o.get("ename") in (KERNEL_DIED, NOT_RUN) for o in cell.get("outputs", [])):
                continue
            if time.monotonic() - self._started > self.notebook_timeout:
                return
            try:
                self.execute_cell(copy.deepcopy(cell), before, store_history=False)
            except DeadKernelError:
                run_sync(self._async_new_kernel)()

    async def _async_new_kernel(self) -> None:
        if self.kc is not None:
            await ensure_async(self.kc.stop_channels())
        with self._memory_cap():
            await ensure_async(self.km.restart_kernel(now=True))
        await self.async_start_new_kernel_client()

    async def async_start_new_kernel(self, **kwargs) -> None:
        with self._memory_cap():
            await super().async_start_new_kernel(**kwargs)

    @contextmanager
    def _memory_cap(self):
        """The kernel inherits this process's limits when it starts: lower the data limit just for the start."""
        soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
        cap = self.kernel_memory_gb << 30
        resource.setrlimit(resource.RLIMIT_DATA, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
        try:
            yield
        finally:
            resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


# nbgrader's autograde with CourseExecute where its Execute was (nbgrader_config.py).
AUTOGRADE_PREPROCESSORS = [CourseExecute if p is Execute else p for p in Autograde.class_traits()["autograde_preprocessors"].default()]
