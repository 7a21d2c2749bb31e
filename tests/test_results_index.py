"""results/README.md, the index a reader opens in results/: short, a section per machine, and every number in it
generated from the JSON files (``helpers.instructor.results_index``); the log of every run, results/HISTORY.md,
is for maintainers and no learner's page points into it."""

import json
import re
import shutil

from helpers.instructor import grading, readme, results_index

REPO = grading.REPO
INDEX = REPO / "results" / "README.md"
# A measured number: a decimal (12.34), a ratio (1.2x, 3×) or a share (74%).
MEASURED = re.compile(r"\d+\.\d+|\b\d+[x×](?!\w)|\d+\s?%")


def hand_written(text: str) -> str:
    """The index without its generated blocks."""
    return readme.BLOCK.sub("", text)


def test_the_index_is_read_in_two_minutes():
    lines = INDEX.read_text().splitlines()
    assert len(lines) < 250, f"results/README.md has {len(lines)} lines: an index, under 250 (the log is HISTORY.md)"


def test_its_hand_written_text_states_no_measured_number():
    found = MEASURED.findall(hand_written(INDEX.read_text()))
    assert not found, f"results/README.md's own text states {found}: a number belongs in a generated table"
    assert all(MEASURED.search(n) for n in ("1.92x", "3×", "74 %")) and not MEASURED.search("2 cores, int8, GPT-2, Day 15")


def test_every_machine_with_a_benchmark_has_a_section():
    text = INDEX.read_text()
    for path in (REPO / "results").glob("benchmark-*.json"):
        machine = json.loads(path.read_text())["machine"]
        assert f"\n## {results_index.machine_name(machine)}\n" in text, f"no section for the machine of {path.name}"


def test_a_changed_result_changes_the_index_and_its_commit_stays(tmp_path):
    results = tmp_path / "results"
    shutil.copytree(REPO / "results", results, ignore=shutil.ignore_patterns("gpu", "reference", "*.md"))
    before = results_index.machines(results, index=INDEX)
    path = results / "benchmark-znver5-2cores.json"
    record = json.loads(path.read_text())
    row = next(r for r in record["rows"] if r["model"] == "resnet50")
    row["TVM tuned"] = {"median_ms": 123.45, "iqr_ms": 60.0, "repeats": 20}  # slower, and all noise
    path.write_text(json.dumps(record))
    after = results_index.machines(results, index=INDEX)
    changed = [line for line in after.splitlines() if line not in before.splitlines()]
    assert len(changed) == 1 and "| ResNet-50 |" in changed[0] and "TVM tuned ≈ 123.45 (60.00)" in changed[0], changed
    # outside a git repository the commits are those the index states, and no table links a Markdown file it lacks
    assert re.findall(r"commit `(\w+)`", after) == re.findall(r"commit `(\w+)`", INDEX.read_text())
    assert "every column" not in after


def test_the_commit_is_gits_and_unknown_where_git_cannot_say(tmp_path):
    (tmp_path / "x.json").write_text("{}")
    assert results_index.commit_of(tmp_path / "x.json") is None
    commit = results_index.commit_of(REPO / "results" / "benchmark-znver5-2cores.json")
    assert commit is None or re.fullmatch(r"[0-9a-f]{7}", commit)


def test_no_learners_page_points_into_the_log():
    pages = [REPO / "README.md", *(REPO / "notebooks").rglob("*.ipynb"), *(REPO / "notebooks").rglob("*.md"),
             *(REPO / "solutions").rglob("*.ipynb")]
    pointing = [str(p.relative_to(REPO)) for p in pages if "HISTORY.md" in p.read_text()]
    assert not pointing, f"{pointing} point a learner into results/HISTORY.md, the maintainers' log: point to results/README.md"
