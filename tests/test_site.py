"""The course as a website (`make site`): nothing secret is published, and every page works offline.

The unit tests run in phase one. The build runs in phase two (``after_notebooks``): it publishes
the solutions that phase one's autograde executed (quick mode), so the suite executes no day again
for it. Screenshots of every page land in artifacts/site/.
"""

import functools
import http.server
import os
import shutil
import threading
from pathlib import Path

import nbformat
import pytest

from helpers.instructor import grading, site
from helpers.rpc_tuning import free_port

REPO = Path(__file__).resolve().parent.parent
SCREENSHOTS = REPO / "artifacts" / "site"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture(scope="module")
def secrets():
    return site.secret_lines()


def test_every_day_has_secrets_to_keep(secrets):
    # the leak check is only as good as its list: every day has solution or hidden-test lines in it
    assert set(secrets.values()) == set(grading.assignments())


@pytest.mark.parametrize("day", grading.assignments())
def test_stripping_leaves_no_solution_hidden_test_output_or_grader_metadata(day, secrets):
    nb = site.strip(nbformat.read(REPO / "solutions" / day / f"{day}.ipynb", as_version=4))
    text = nbformat.writes(nb)
    assert not [m for m in site.MARKERS if m in text]
    assert not [line for line in secrets if site.json_escape(line) in text]
    assert "nbgrader" not in text
    source = nbformat.read(REPO / "solutions" / day / f"{day}.ipynb", as_version=4)
    for before, after in zip(source.cells, nb.cells):
        grader = before.metadata.get("nbgrader", {})
        if before.cell_type == "code" and (grader.get("solution") or grader.get("grade")):
            assert after.outputs == []


def test_a_line_the_helpers_ship_is_no_secret_but_the_rest_of_a_solution_is(secrets):
    # Day 12's tensor intrinsic opens with the line every intrinsic in helpers/int8.py opens with, and
    # other days print those intrinsics: published, it gives nothing away
    assert 'with T.sblock("root"):' not in secrets
    assert any("llvm.x86.ssse3.pmadd.ub.sw.128" in line for line in secrets)


def test_the_leak_check_finds_a_line_split_by_highlighting_and_escaped(tmp_path):
    secret = 'return {"fastest": name}  # the answer'
    (tmp_path / "page.html").write_text(
        '<pre><span class="k">return</span> <span class="p">{</span><span class="s2">&quot;fastest&quot;</span>'
        '<span class="p">:</span> <span class="n">name</span><span class="p">}</span>  '
        '<span class="c1"># the answer</span></pre>')
    (tmp_path / "searchindex.js").write_text('Search.setIndex({"t": "### BEGIN HIDDEN TESTS"})')
    (tmp_path / "clean.html").write_text("<p>nothing to see</p>")
    (tmp_path / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    found = site.leaks(tmp_path, {secret: "day99"})
    assert any(f.startswith("page.html: a line of day99") for f in found)
    assert any(f.startswith("searchindex.js: nbgrader marker") for f in found)
    assert not [f for f in found if f.startswith(("clean.html", "image.png"))]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("site") / "html"
    origins = []
    site.build(quick=True, run=False, out=out, log=origins.append)
    return out, origins


@pytest.mark.after_notebooks
def test_the_site_has_every_day_with_outputs_and_nothing_secret_in_any_file(built, secrets):
    out, origins = built
    assert (out / "index.html").is_file()
    assert {f"days/{day}.html" for day in grading.assignments()} <= set(site.pages(out))
    assert (out / "results" / "README.html").is_file()
    assert not (out / "_sources").exists(), "Sphinx copied the notebooks' sources"
    assert site.leaks(out, secrets) == []
    if os.environ.get("CI"):
        # in the full suite every day was executed by phase one's autograde: the site shows its outputs
        assert not [line for line in origins if "no outputs" in line], origins


class _Quiet(http.server.SimpleHTTPRequestHandler):
    """Serves the site; answers every request in full (no 304), so that each response must be a 200."""

    def send_head(self):
        del self.headers["If-Modified-Since"]
        return super().send_head()

    def log_message(self, *args):
        pass


@pytest.mark.after_notebooks
def test_every_page_loads_offline_with_every_image(built):
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            pytest.fail("chromium is missing in CI: `make browser` installs Debian's chromium", pytrace=False)
        pytest.skip("Debian's chromium is not installed (run `make browser` as root)")
    sync_api = pytest.importorskip("playwright.sync_api")
    out, _ = built
    port = free_port()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), functools.partial(_Quiet, directory=str(out)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{port}/"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    problems, outside = [], []
    try:
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
                "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync"])
            page = browser.new_page(viewport={"width": 1300, "height": 900})
            page.on("request", lambda r: None if r.url.startswith((base, "data:", "blob:")) else outside.append(r.url))
            page.on("response", lambda r: problems.append(f"{r.status} {r.url}") if r.status != 200 else None)
            names = site.pages(out)
            # every page until its images are loaded; the first page of each kind also until the network is quiet,
            # so that what its scripts fetch after loading is seen too (as slow as three other pages)
            quiet = {"index.html", f"days/{grading.assignments()[0]}.html", "results/README.html"}
            for name in names:
                page.goto(base + name, wait_until="networkidle" if name in quiet else "load")
                broken = page.evaluate(
                    "Array.from(document.images).filter(i => !i.complete || i.naturalWidth === 0).map(i => i.src)")
                problems += [f"{name}: image not loaded: {src}" for src in broken]
                page.screenshot(path=str(SCREENSHOTS / (name.replace("/", "_") + ".png")))
            browser.close()
    finally:
        server.shutdown()
    assert not outside, f"pages asked for something outside the machine: {sorted(set(outside))[:10]}"
    assert not problems, problems[:20]
    assert len(list(SCREENSHOTS.glob("*.png"))) >= len(grading.assignments())


def test_a_progress_bar_keeps_its_text_and_loses_the_widget_that_would_come_from_a_cdn():
    nb = nbformat.v4.new_notebook(metadata={"widgets": {"state": {}}})
    bar = nbformat.v4.new_output("display_data", data={site.WIDGET: {"model_id": "abc"}, "text/plain": "models: 3/3"})
    only_widget = nbformat.v4.new_output("display_data", data={site.WIDGET: {"model_id": "def"}})
    nb.cells.append(nbformat.v4.new_code_cell("for m in tqdm(models): ...", outputs=[bar, only_widget]))
    stripped = site.strip(nb)
    assert [out["data"] for out in stripped.cells[0].outputs] == [{"text/plain": "models: 3/3"}]
    assert "widgets" not in stripped.metadata
