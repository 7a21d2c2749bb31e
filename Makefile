# The course's single entry point. The README's two commands:
#   make lab    build the environment if needed, then open the course in JupyterLab
#   make test   build the environment if needed, then run the whole test suite (what CI runs)
# Everything installs from requirements.txt, the one list of pins (and requirements-nodeps.txt, without
# their dependencies).

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(abspath $(VENV))/bin
READY  := $(VENV)/.course-env-ready
# llama.cpp, Day 15's second peer (requirements-benchmark.txt), for make benchmark and make test only: pip builds it
# from source the first time (about 6 minutes on a Zen 4's two cores), then keeps the wheel in its cache.
PEERS  := $(VENV)/.benchmark-peers-ready
KERNEL := tvm-course
# JupyterLab's setting overrides for the course (helpers/instructor/labsettings.py: no news pop-up on first start).
LAB_SETTINGS := $(VENV)/share/jupyter/lab/settings/overrides.d/tvm-course.json
# nbgrader runs `alembic` to create a gradebook: the environment's bin must be on PATH.
export PATH := $(BIN):$(PATH)

.PHONY: env browser proxy hub lab check test site benchmark capstone databases student handout readme outputs submit import autograde feedback grades formgrader clean-env

env: $(READY) $(LAB_SETTINGS)

$(READY): requirements.txt requirements-nodeps.txt pyproject.toml
	@$(PYTHON) -c 'import sys; v = sys.version_info[:2]; sys.exit(0 if v == (3, 11) else "The course needs Python 3.11 (the pins are for it); found %d.%d. Set PYTHON=/path/to/python3.11." % v)'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet pip==26.3
	$(BIN)/python -m pip install --quiet -r requirements.txt
	$(BIN)/python -m pip install --quiet --no-deps -r requirements-nodeps.txt
	$(BIN)/python -m pip install --quiet --no-deps -e .
	$(BIN)/python -m ipykernel install --sys-prefix --name $(KERNEL) --display-name "TVM course (Python 3.11)"
	@touch $@

$(PEERS): requirements-benchmark.txt $(READY)
	$(BIN)/python -m pip install --quiet -r requirements-benchmark.txt
	@touch $@

# A rule of its own, so that an environment built before it existed gets it too.
$(LAB_SETTINGS): helpers/instructor/labsettings.py $(READY)
	$(BIN)/python -m helpers.instructor.labsettings

# The browser test drives JupyterLab in Debian's headless Chromium (installed here when run as root, as in CI).
browser:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; } \
	  || echo "chromium is missing and needs root to install (apt-get install chromium): the browser test will be skipped"

# Jupyter refuses to run as root unless told; containers and CI machines often are root.
AS_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)

need = $(if $(strip $($(1))),,$(error make $@ needs $(1)=...: make $@ $(2)))

# Your own copies of the notebooks: work/ (git ignores it), filled from notebooks/ with what it lacks,
# never overwritten, so that doing the exercises changes no file of the course.
LAB_ROOT ?= work

lab: env
	$(BIN)/python -m helpers.instructor.selfstudy fill --into $(LAB_ROOT)
	$(BIN)/jupyter lab --ServerApp.root_dir=$(LAB_ROOT) $(AS_ROOT) $(LAB_ARGS)

# Grade your copy of a day (work/dayNN_*/) with the visible and hidden tests: make check DAY=3
check: env
	$(call need,DAY,DAY=3)
	$(BIN)/python -m helpers.instructor.selfstudy check $(DAY) --work $(LAB_ROOT)

# TVM_COURSE_QUICK shrinks heavy work (repeats, sweeps, tuning budgets) to a reduced but real size.
# Two phases (tests/run_suite.py): what times nothing on two workers, then the timed tests alone.
# make test DAY=7 runs one day's checks alone (tests/one_day.py); make test alone, the whole suite.
# A class's handout (make handout) has no tests/: there make test says so, before installing anything.
ifeq ($(wildcard tests/run_suite.py),)
test:
	@echo "make test runs the course's test suite, which a class handout does not hold (its tests read the solutions): run the test cells in each notebook to check your work" >&2; exit 1
else
test: env browser proxy $(PEERS)
	$(BIN)/python tests/run_suite.py $(if $(DAY),--day $(DAY)) $(PYTEST_ARGS)
endif

# The course as a static website in build/site/html (helpers/instructor/site.py): every day executed
# once at full size (cached), solutions and hidden tests stripped; SITE_ARGS=--quick for CI's sizes.
site: env
	$(BIN)/python -m helpers.instructor.site $(SITE_ARGS)

# Is it actually faster? Eager, torch.compile, TVM untuned and tuned, side by side; kept in results/.
# Then Day 12's int8 comparison on MobileNetV2 (PyTorch fp32 and int8, TVM fp32 and int8 tuned), and
# Day 14's small GPT (two tuned prefill buckets and a decoding step against PyTorch), and Day 15's LLM against
# llama.cpp and OpenVINO GenAI (llama.cpp from requirements-benchmark.txt: $(PEERS) above).
benchmark: env $(PEERS)
	$(BIN)/python -m helpers.maintainers.benchmark table $(MODELS)
	$(BIN)/python -m helpers.maintainers.benchmark int8
	$(BIN)/python -m helpers.maintainers.benchmark transformer
	$(BIN)/python -m helpers.maintainers.benchmark transformer-large
	$(BIN)/python -m helpers.maintainers.llm_roofline

# Day 11's capstone table (operator mix, eager vs tuned TVM, profile shares), kept in results/.
capstone: env
	$(BIN)/python -m helpers.maintainers.capstone

# Every tuning database (shipped, yours, test runs'), where it came from, its budget, and whether it fits this CPU.
databases: env
	$(BIN)/python -m helpers.databases list

# Regenerate the student notebooks from the instructor sources (nbgrader generate_assignment): every day, or
# DAY=3 (03, day03, day03_build: as make check reads it) that day only.
student: env
	$(BIN)/python -m helpers.instructor.grading generate $(DAY)

# The course without solutions/ and tests/, for a class: build/handout/tvm-course-handout.tar.gz; DAY=3 holds
# that day's notebook only (build/handout/tvm-course-handout-day03_build.tar.gz).
handout: env
	$(BIN)/python -m helpers.instructor.handout $(DAY)

# The README's and docs/instructors.md's generated parts (the answer from results/, the days, their times, the exercises)
readme: env
	$(BIN)/python -m helpers.instructor.readme

# Re-execute a changed source notebook and store the outputs nbval checks: make outputs NB=solutions/day01_import/day01_import.ipynb
outputs: env
	$(BIN)/python -m helpers.instructor.notebooks $(NB)

# The instructor's workflow on the repo's own gradebook (see README, "For instructors"). Each works
# on a fresh clone (autograde records the day in the gradebook if `make student` never ran) or
# says in one line what to run first.
submit: env
	$(call need,DAY,DAY=day01_import STUDENT=ada NB=path/to/ada.ipynb)$(call need,STUDENT,DAY=$(DAY) STUDENT=ada NB=path/to/ada.ipynb)$(call need,NB,DAY=$(DAY) STUDENT=$(STUDENT) NB=path/to/notebook.ipynb)
	$(BIN)/python -m helpers.instructor.grading submit $(DAY) $(STUDENT) $(NB)
# A class's submissions downloaded from Canvas or Moodle (the zip, or its folder): the roster, each notebook filed as
# make submit files it, and each one's time, for due dates: make import DAY=1 FROM=download.zip [TIMES=times.csv] [DUE='2026-03-02 23:59 Europe/Berlin']
import: env
	$(call need,DAY,DAY=1 FROM=path/to/download.zip)$(call need,FROM,DAY=$(DAY) FROM=path/to/download.zip)
	$(BIN)/python -m helpers.instructor.lms_import import $(DAY) "$(FROM)" $(if $(TIMES),--times "$(TIMES)") $(if $(DUE),--due "$(DUE)")
# Progress as it grades, then every student's score and a line per problem; STUDENT=ada grades one student.
autograde: env
	$(call need,DAY,DAY=day01_import)
	$(BIN)/python -m helpers.instructor.grading autograde $(DAY) $(if $(STUDENT),--student $(STUDENT))
	$(BIN)/python -m helpers.instructor.grade_table report $(DAY)
feedback: env
	$(call need,DAY,DAY=day01_import)
	$(BIN)/python -m helpers.instructor.grading feedback $(DAY) $(if $(ALLOW_UNGRADED),--allow-ungraded)
grades: env
	$(BIN)/python -m helpers.instructor.grade_table export grades.csv

# The Formgrader on this machine, off the hub: grade Day 11's written answers (docs/instructors.md, "Written answers").
formgrader: env
	$(BIN)/jupyter lab --ServerApp.root_dir=. --ServerApp.default_url=/formgrader $(AS_ROOT) $(LAB_ARGS)

# JupyterHub for a class on this machine (README, "A class on JupyterHub"). configurable-http-proxy,
# pinned in hub/package.json and hub/package-lock.json, goes into hub/node_modules (not in git).
PROXY := hub/node_modules/.installed
$(PROXY): hub/package.json hub/package-lock.json
	npm ci --prefix hub --no-audit --no-fund --loglevel=error && touch $@
proxy:
	@command -v npm >/dev/null && $(MAKE) -s $(PROXY) || echo "npm is missing: install Node.js 20 and npm for the hub (and its test)"

# As root: learners' servers run as their own Unix accounts. HUB_ARGS=--no-release releases nothing.
hub: env proxy
	@[ "$$(id -u)" = 0 ] || { echo "make hub needs root (sudo make hub): the hub starts each learner's server as their Unix account and checks passwords with PAM"; exit 1; }
	$(BIN)/python -m helpers.instructor.hub serve $(HUB_ARGS)

clean-env:
	rm -rf $(VENV)
