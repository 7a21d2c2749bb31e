"""`make site`: the course as a static website, read in a browser before anything is installed.

Every day becomes a page with the outputs of an executed run of its source notebook, after
nbgrader's own ``ClearSolutions`` and ``ClearHiddenTests`` (the code a learner must write and the
tests they must not see are replaced exactly as in the student version), with the outputs of the
solution and test cells cleared and nbgrader's metadata dropped. The README's course map and the
measured results (``results/``: its index and tables; its log, ``HISTORY.md``, among the maintainers'
pages) are pages too. Sphinx builds it (myst-nb, sphinx-book-theme) with
execution off, no source copies (``_sources/``), no download buttons and no MathJax, so the site
works offline and publishes nothing secret; ``leaks`` checks every built file for that.

Executed notebooks are cached under ``build/site/executed/<mode>/``, keyed by the notebook,
``helpers/`` and ``requirements.txt``: change any and the day runs again. ``--quick`` uses the
reduced sizes of ``make test`` (the test suite's autograde leaves its executed solutions there).

    python -m helpers.instructor.site            # full size: every day executed once (long)
    python -m helpers.instructor.site --quick    # quick mode, as CI builds it
"""

from __future__ import annotations

import argparse
import hashlib
import html
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import nbformat

from .. import config
from .grading import RELEASE, SOURCE, assignments

REPO = config.REPO
SITE_ROOT = REPO / "build" / "site"
EXECUTED_ROOT = SITE_ROOT / "executed"
IMAGES = (".svg", ".png", ".jpg", ".jpeg", ".gif")
# What nbgrader's markers look like in a source: none of them may reach a built file.
MARKERS = ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS")
_REGION = re.compile(r"### BEGIN (SOLUTION|HIDDEN TESTS)\n(.*?)### END \1", re.S)
_TAG = re.compile(r"<[^>]+>")
WIDGET = "application/vnd.jupyter.widget-view+json"
GLOSSARY = "GLOSSARY.md"

CONF = '''# Written by helpers/instructor/site.py: edit that file, not this one.
project = "TVM from PyTorch to a tuned module: a course"
extensions = ["myst_nb"]
html_theme = "sphinx_book_theme"
html_title = project
nb_execution_mode = "off"            # executed once, before Sphinx, with the course kernel
nb_ipywidgets_js = {}                # no widget code from a CDN: the pages carry no live widgets
html_copy_source = False             # no _sources/: the page is all that is published
html_show_sourcelink = False
html_theme_options = {"use_download_button": False, "use_fullscreen_button": False,
                      "use_repository_button": False, "show_toc_level": 2}
myst_enable_extensions = []          # no dollar math: the course has none, and MathJax would come from a CDN
suppress_warnings = ["myst.header", "misc.highlighting_failure"]
exclude_patterns = ["_build"]
'''


def cache_key(day: str, quick: bool) -> str:
    """What an executed day depends on: its notebook, the helpers, the pins and the mode."""
    digest = hashlib.sha256(b"quick" if quick else b"full")
    files = [REPO / SOURCE / day / f"{day}.ipynb", REPO / "requirements.txt",
             *sorted((REPO / "helpers").rglob("*.py"))]
    for path in files:
        digest.update(path.relative_to(REPO).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:20]


def executed_path(day: str, quick: bool) -> Path:
    return EXECUTED_ROOT / ("quick" if quick else "full") / f"{day}-{cache_key(day, quick)}.ipynb"


def store_executed(day: str, notebook: Path, quick: bool) -> Path:
    """Keep an executed run of the day's source (e.g. the suite's autograde of the solution) for the site."""
    dest = executed_path(day, quick)
    dest.parent.mkdir(parents=True, exist_ok=True)
    for old in dest.parent.glob(f"{day}-*.ipynb"):
        old.unlink()
    tmp = dest.with_suffix(f".{os.getpid()}.tmp")
    shutil.copyfile(notebook, tmp)
    tmp.replace(dest)
    return dest


def execute(day: str, quick: bool, timeout: int = 3600) -> Path:
    """The day's source executed top to bottom on the course kernel (cached; see ``cache_key``)."""
    from nbclient import NotebookClient

    dest = executed_path(day, quick)
    if dest.is_file():
        return dest
    source = REPO / SOURCE / day / f"{day}.ipynb"
    nb = nbformat.read(source, as_version=4)
    os.environ["TVM_COURSE_QUICK"] = "1" if quick else ""
    NotebookClient(nb, timeout=timeout, kernel_name="tvm-course", allow_errors=False,
                   resources={"metadata": {"path": str(source.parent)}}).execute()
    dest.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, dest)
    return dest


def strip(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The notebook as a learner may see it: solutions and hidden tests cleared by nbgrader's own
    preprocessors, no output of a solution or test cell, no nbgrader metadata."""
    from nbgrader.preprocessors import ClearHiddenTests, ClearSolutions

    nb = nbformat.from_dict(nb)
    resources: dict = {}
    nb, resources = ClearSolutions().preprocess(nb, resources)
    nb, resources = ClearHiddenTests().preprocess(nb, resources)
    for cell in nb.cells:
        grader = cell.metadata.pop("nbgrader", {})
        cell.metadata.pop("execution", None)
        if cell.cell_type == "code" and (grader.get("solution") or grader.get("grade")):
            cell.outputs, cell.execution_count = [], None
        if cell.cell_type == "code":
            cell.outputs = [out for out in map(_without_widget, cell.outputs) if out is not None]
    for key in ("nbgrader", "widgets"):
        nb.metadata.pop(key, None)
    return nb


def _without_widget(output: dict) -> dict | None:
    """An output without its live widget view (a progress bar's), which a static page cannot show and
    would fetch widget code from a CDN for: the text it also carries stays."""
    data = output.get("data")
    if data is None or WIDGET not in data:
        return output
    del data[WIDGET]
    return output if data else None


def _course_map() -> str:
    """The README, from its first heading, as the site's front page (links to days become page links);
    the glossary, the results and the documents for instructors and maintainers are pages of their own. The results'
    log (results/HISTORY.md) is the maintainers': the results' pages are the index and the tables (named ``kind-cpu``)."""
    text = (REPO / "README.md").read_text()
    text = re.sub(r"\((?:\./)?(?:notebooks|solutions)/(day\d\d_\w+)/\1\.ipynb\)", r"(days/\1.ipynb)", text)
    text = re.sub(r"\((?:\./)?solutions/day\d\d_\w+/([\w.-]+\.svg)\)", r"(days/\1)", text)  # figures sit beside their day
    text = text.replace("](results/)", "](results/README.md)").replace(f"]({RELEASE}/{GLOSSARY})", f"]({GLOSSARY})")
    return text + "\n\n```{toctree}\n:hidden:\n:caption: Days\n:glob:\n\ndays/*\n```\n\n" \
        f"```{{toctree}}\n:hidden:\n:caption: Reference\n\n{GLOSSARY[:-3]}\n```\n\n" \
        "```{toctree}\n:hidden:\n:caption: Results\n:glob:\n\nresults/README\nresults/*-*\n```\n\n" \
        "```{toctree}\n:hidden:\n:caption: For instructors and maintainers\n:glob:\n\ndocs/*\nresults/HISTORY\n```\n"


def write_sources(dest: Path, quick: bool, run: bool = True, log=print) -> dict[str, str]:
    """The Sphinx project: conf.py, the front page, one stripped notebook a day, results/.

    Returns, per day, where its outputs came from ("executed (cached)", "executed now", or
    "no outputs" when ``run`` is False and nothing is cached).
    """
    if dest.exists():
        shutil.rmtree(dest)
    (dest / "days").mkdir(parents=True)
    (dest / "conf.py").write_text(CONF)
    (dest / "index.md").write_text(_course_map())
    origin = {}
    for day in assignments():
        cached = executed_path(day, quick)
        if cached.is_file():
            path, origin[day] = cached, "executed (cached)"
        elif run:
            log(f"executing {day} ({'quick' if quick else 'full'} mode) ...")
            started = time.perf_counter()
            path, origin[day] = execute(day, quick), f"executed now ({time.perf_counter() - started:.0f} s)"
        else:
            path, origin[day] = REPO / SOURCE / day / f"{day}.ipynb", "no outputs"
        nbformat.write(strip(nbformat.read(path, as_version=4)), dest / "days" / f"{day}.ipynb")
        for image in (REPO / SOURCE / day).iterdir():
            if image.suffix in IMAGES:
                shutil.copyfile(image, dest / "days" / image.name)
    shutil.copytree(REPO / "results", dest / "results", ignore=shutil.ignore_patterns("*.json", "gpu", "reference"))
    shutil.copyfile(REPO / RELEASE / GLOSSARY, dest / GLOSSARY)  # days link it as ../GLOSSARY.md
    shutil.copytree(REPO / "docs", dest / "docs")
    for page in (dest / "results").glob("*-*.md"):  # "Benchmark, measured ..." names no machine: the file does
        title, _, rest = page.read_text().partition("\n")
        page.write_text(f"{title} ({page.stem})\n{rest}")
    return origin


def build(quick: bool = False, run: bool = True, out: Path = SITE_ROOT / "html", log=print) -> Path:
    """Write the sources and run Sphinx; returns the folder of the built site (``index.html``)."""
    source = SITE_ROOT / "src"
    origin = write_sources(source, quick, run, log)
    for day, where in origin.items():
        log(f"  {day}: {where}")
    if out.exists():
        shutil.rmtree(out)
    subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-q", "-j", "1", str(source), str(out)],
                   check=True, cwd=REPO)
    sources = out / "_sources"
    if sources.is_dir() and not any(sources.iterdir()):
        sources.rmdir()  # Sphinx makes the folder even with html_copy_source off; nothing is in it
    found = leaks(out)
    if found:
        raise RuntimeError("The site would publish solutions or hidden tests; nothing was published:\n"
                           + "\n".join(found[:20]))
    return out


def secret_lines(course: Path = REPO) -> dict[str, str]:
    """Every line of every solution and hidden-test region (and of written-answer solutions) that
    no student version also contains, nor the helpers' code that ships with the course (a line a learner
    is shown is not a secret: ``with T.sblock("root"):`` in a tensor intrinsic), mapped to its day."""
    secrets = {}
    released = "\n".join((course / RELEASE / day / f"{day}.ipynb").read_text() for day in assignments(course))
    shipped = "\n".join(path.read_text() for path in sorted((course / "helpers").rglob("*.py")))
    for day in assignments(course):
        nb = nbformat.read(course / SOURCE / day / f"{day}.ipynb", as_version=4)
        for cell in nb.cells:
            grader = cell.metadata.get("nbgrader", {})
            if cell.cell_type == "markdown" and grader.get("solution"):
                regions = [cell.source]
            else:
                regions = [m.group(2) for m in _REGION.finditer(cell.source)]
            for region in regions:
                for line in region.splitlines():
                    line = line.strip()
                    if len(line) >= 16 and json_escape(line) not in released and line not in shipped:
                        secrets[line] = day
    return secrets


def json_escape(line: str) -> str:
    """A line as it appears inside a notebook's JSON (where the student version is searched)."""
    return json.dumps(line, ensure_ascii=False)[1:-1]


def _readable(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None


def leaks(site: Path, secrets: dict[str, str] | None = None, files: Iterable[Path] | None = None) -> list[str]:
    """Each built file (pages, search index, anything else; or only ``files``, under ``site``) that holds
    a solution or hidden-test line or one of nbgrader's markers, with what it holds. HTML is read as
    text, tags removed, so that a line split into highlighting spans is still found."""
    secrets = secret_lines() if secrets is None else secrets
    found = []
    for path in sorted(files if files is not None else (p for p in site.rglob("*") if p.is_file())):
        raw = _readable(path)
        if raw is None:
            continue
        texts = [raw, html.unescape(_TAG.sub("", raw))]
        for marker in MARKERS:
            if any(marker in text for text in texts):
                found.append(f"{path.relative_to(site)}: nbgrader marker {marker!r}")
        for line, day in secrets.items():
            if any(line in text for text in texts):
                found.append(f"{path.relative_to(site)}: a line of {day}'s solutions or hidden tests: {line!r}")
    return found


def pages(site: Path) -> list[str]:
    """The site's pages, relative to its root (what a browser test opens)."""
    skip = {"genindex.html", "search.html"}
    return sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html")
                  if not p.name.startswith("_") and p.name not in skip and "_static" not in p.parts)


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="reduced sizes (TVM_COURSE_QUICK), as CI builds it")
    parser.add_argument("--no-run", action="store_true", help="execute nothing: days not yet executed get no outputs")
    args = parser.parse_args(list(argv) if argv is not None else None)
    started = time.perf_counter()
    out = build(quick=args.quick, run=not args.no_run)
    print(f"site built in {time.perf_counter() - started:.0f} s: {out / 'index.html'} "
          f"({len(pages(out))} pages, no solution or hidden test in any file)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
