"""nbgrader configuration for the course (the repo root is the course directory).

solutions/<day>/<day>.ipynb are the instructor sources; `make student` runs
`nbgrader generate_assignment` to write notebooks/<day>/<day>.ipynb, the
student versions learners open. Submissions, autograded copies, feedback and
the gradebook stay out of git (see .gitignore).
"""

c = get_config()  # noqa: F821  (provided by nbgrader)

c.CourseDirectory.course_id = "tvm-course"
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "notebooks"

# What a learner sees in place of a solution.
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"

# Student versions carry no outputs.
c.ClearOutput.enabled = True

# Autograding on the 2-core machine: a cell that runs longer than this is an
# infinite loop or a far too large workload; it costs only its own exercise.
# (A cell that raises does not stop the run: nbgrader's Execute always goes on, its allow_errors is
# True and not a config option.)
c.Execute.timeout = 300
c.Execute.interrupt_on_timeout = True
c.Execute.kernel_name = "tvm-course"

# A kernel that dies (a crash, os._exit, a segfault, memory exhausted) costs only the cell that killed it
# (nbgrader's own deletes the whole graded notebook); one notebook may run an hour in all; each kernel may
# allocate 8 GB; a cell past its limit says so: helpers/instructor/execute.py.
from helpers.instructor.execute import AUTOGRADE_PREPROCESSORS  # noqa: E402 (set below, with the others)

c.CourseExecute.notebook_timeout = 3600
c.CourseExecute.kernel_memory_gb = 8

# A warning that a test cell "has changed" only where the learner edited it (nbgrader's own warns about
# every untouched test cell that has hidden tests): helpers/instructor/overwrite_cells.py.
from helpers.instructor.overwrite_cells import SANITIZE_PREPROCESSORS  # noqa: E402

# A written answer is graded against the learner's own numbers, which autograde's run replaces with the
# grading machine's: the outputs of the cells tagged for it are kept as submitted and shown above the
# answer (helpers/instructor/learner_outputs.py).
from helpers.instructor.learner_outputs import KeepLearnerOutputs, ShowLearnerOutputs  # noqa: E402

c.Autograde.sanitize_preprocessors = [KeepLearnerOutputs, *SANITIZE_PREPROCESSORS]
c.Autograde.autograde_preprocessors = [*AUTOGRADE_PREPROCESSORS, ShowLearnerOutputs]

# Feedback never shows a hidden test, neither its code nor a traceback's lines of it (nbgrader's own
# feedback shows both): helpers/instructor/feedback_hidden.py. The hub's course directory is a copy
# of this config, so its feedback is made the same way.
from helpers.instructor.feedback_hidden import FEEDBACK_PREPROCESSORS  # noqa: E402

c.GenerateFeedback.preprocessors = FEEDBACK_PREPROCESSORS
