"""What a tuning run shows: a progress bar over its trials, on stdout, and MetaSchedule's own tables kept out
of the notebook (in ``work_dir/logs``).
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator

from tqdm import tqdm
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback


MS_LOGGER = "tvm.s_tir.meta_schedule"


@derived_object
class _ProgressCallback(PyMeasureCallback):
    """Advance a tqdm bar by the number of candidates measured in each round."""

    def __init__(self, bar: tqdm, task_names: list[str]) -> None:
        super().__init__()
        self.bar = bar
        self.task_names = task_names
        self.measured = 0
        self.failed = 0

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results) -> None:
        count = len(measure_candidates)
        failed = sum(
            1
            for built, ran in zip(builder_results, runner_results)
            if built.error_msg is not None or ran.error_msg is not None or not ran.run_secs
        )
        self.measured += count
        self.failed += failed
        self.bar.set_postfix_str(f"{self.task_names[int(task_id)][:40]}, {self.failed} failed", refresh=False)
        self.bar.update(count)


@contextlib.contextmanager
def progress_bar(tasks: list, trials: int, disable: bool = False) -> Iterator[list]:
    """A bar over ``trials`` measured candidates, for ``ms.tune_tasks(..., measure_callbacks=...)``.

    Yields MetaSchedule's default measure callbacks (they store each measurement in the database
    and train the cost model) plus one that advances the bar; on stdout, not stderr (graders count
    stderr as failure). Tasks with few possible schedules finish early: the bar then ends short.
    """
    bar = tqdm(total=trials, desc=f"Tuning {len(tasks)} tasks", unit="trial", file=sys.stdout,
               disable=disable, dynamic_ncols=True)
    try:
        yield [*ms.measure_callback.MeasureCallback.create("default"), _ProgressCallback(bar, [t.task_name for t in tasks])]
    finally:
        if bar.n < bar.total:
            bar.total = bar.n
            bar.refresh()
        bar.close()


@contextlib.contextmanager
def quiet_metaschedule() -> Iterator[None]:
    """Keep MetaSchedule's progress tables in work_dir/logs and out of the notebook.

    Two channels to close. Its Python loggers: when MetaSchedule sets up the logs
    of a run it gives its console handler the logger's current level (WARNING
    here keeps warnings and errors visible), then sets the logger to DEBUG for the
    files. And in Jupyter it skips the loggers and ``display()``s a pandas table
    plus a C++ printout after every round; it asks ``get_ipython()`` (looked up in
    its ``utils`` module) whether it runs in a notebook, so the answer is no here.
    """
    ms_logger = logging.getLogger(MS_LOGGER)
    ms_logger.setLevel(logging.WARNING)
    # Each run adds a console and a file handler for its own work_dir. Close the previous run's:
    # MetaSchedule would keep writing to its old log file, and a handler it cannot name (pytest's
    # logging reconfigures loggers between tests) breaks its log set-up on the next run.
    for handler in list(ms_logger.handlers):
        ms_logger.removeHandler(handler)
        handler.close()
    ms_utils = ms.utils
    had_own = "get_ipython" in vars(ms_utils)
    previous = vars(ms_utils).get("get_ipython")
    ms_utils.get_ipython = lambda: None
    try:
        yield
    finally:
        if had_own:
            ms_utils.get_ipython = previous
        else:
            del ms_utils.get_ipython
