"""The learner's README: short, with the two commands, and its numbers made from results/ and the days,
never typed; the instructor's handout gives no answer away; reference values print beside a learner's."""

import json
import re
import shutil
import subprocess
import tarfile

import pytest

from helpers import reference
from helpers.errors import GradingError
from helpers.instructor import grading, handout, readme

REPO = grading.REPO


def test_the_readme_is_a_learners_and_short():
    text = (REPO / "README.md").read_text()
    prose = re.sub(r"<!-- (\w+):begin -->.*?<!-- \1:end -->", "", text, flags=re.S)
    words = len(re.sub(r"```.*?```", "", prose, flags=re.S).split())
    assert words < 800, f"the README's prose has {words} words: a learner reads it in two minutes (under 800)"
    for command in ("make lab", "make test", "make check DAY="):
        assert command in text, f"the README must show `{command}`"
    for doc in ("docs/instructors.md", "docs/hub.md", "docs/maintainers.md", "docs/install.md", "notebooks/GLOSSARY.md"):
        assert f"({doc})" in text and (REPO / doc).is_file(), f"the README must link {doc}, and it must exist"


@pytest.mark.parametrize("name", sorted(readme.FILES))
def test_generated_parts_are_what_results_and_the_days_say(name):
    assert (REPO / name).read_text() == readme.generated(name), f"{name} is out of date: run `make readme`"


def test_the_answer_names_its_machines_and_marks_noise(tmp_path):
    table = readme.answer()
    for source in readme.ANSWER_FROM:
        cpu = json.loads((REPO / "results" / source).read_text())["machine"]["cpu"]
        assert f"`{cpu}`" in table, f"the answer must name the machine of {source}"
    results = tmp_path / "results"
    results.mkdir()
    for source in readme.ANSWER_FROM:
        record = json.loads((REPO / "results" / source).read_text())
        row = record["rows"][0]
        row["TVM tuned"]["median_ms"] = row["torch.compile (freezing)"]["median_ms"] * 2  # TVM twice as slow
        row["TVM tuned"]["iqr_ms"] = row["TVM tuned"]["median_ms"]                        # and all noise
        (results / source).write_text(json.dumps(record))
    changed = readme.answer(results)
    assert "**0.50x**" in changed and "≈" in changed and "not always faster" in changed


def test_render_replaces_blocks_inline_and_on_their_own_lines():
    text = "a <!-- x:begin -->old<!-- x:end --> b\n<!-- y:begin -->\n| old |\n<!-- y:end -->\n"
    assert readme.render(text, {"x": "new", "y": "| new |"}) == \
        "a <!-- x:begin -->new<!-- x:end --> b\n<!-- y:begin -->\n| new |\n<!-- y:end -->\n"
    with pytest.raises(KeyError):
        readme.render(text, {"x": "new"})


def _unpacked(path, into):
    with tarfile.open(path) as archive:
        names = archive.getnames()
        archive.extractall(into, filter="data")
    return names


def _what_a_learner_is_told_is_true(folder):
    """The handout's README offers only what a handout can do, and every file it links is in the handout."""
    text = (folder / "README.md").read_text()
    for untrue in ("make test", "make check", "`solutions/`", "holds the solutions", "self-study is on your"):
        assert untrue not in text, f"the handout's README says {untrue!r}"
    assert "make lab" in text and "neither the solutions nor the hidden tests" in text
    links = [link for link in re.findall(r"\]\(([^)#]+)\)", text) if not link.startswith("http")]
    assert links and all((folder / link).exists() for link in links), [link for link in links if not (folder / link).exists()]
    proc = subprocess.run(["make", "-s", "test"], cwd=folder, capture_output=True, text=True)
    assert proc.returncode != 0 and "a class handout does not hold" in proc.stderr, proc.stderr
    return text


def test_the_handout_holds_no_solution_and_no_hidden_test(tmp_path):
    path = handout.build(out=tmp_path / "handout.tar.gz")
    names = _unpacked(path, tmp_path / "out")
    root = f"{handout.NAME}/"
    assert f"{root}notebooks/day00_environment/day00_environment.ipynb" in names
    assert f"{root}helpers/instructor/selfstudy.py" in names and f"{root}Makefile" in names
    assert not any(n.startswith((f"{root}solutions", f"{root}tests")) for n in names)
    assert handout.given_away(tmp_path / "out" / handout.NAME) == []  # no hidden-test line in any file
    text = _what_a_learner_is_told_is_true(tmp_path / "out" / handout.NAME)
    assert all(f"(notebooks/{day}/{day}.ipynb)" in text for day in grading.assignments())
    # the check finds what it looks for: a hidden test anywhere, a file a learner does not read included
    planted = tmp_path / "planted" / "helpers" / "instructor"
    planted.mkdir(parents=True)
    shutil.copy(REPO / grading.SOURCE / "day00_environment" / "day00_environment.ipynb", planted / "notes.ipynb")
    found = handout.given_away(tmp_path / "planted")
    assert len(found) > 20 and all(f.startswith("helpers/instructor/notes.ipynb: a line of a hidden test") for f in found)


def test_a_days_handout_holds_that_days_notebook_and_all_it_needs(tmp_path, capsys):
    """`make handout DAY=3`: Day 3's notebook, the helpers, results, README and Makefile; no other day's notebook."""
    day = "day03_build"
    path = handout.build(out=tmp_path / "day.tar.gz", day=day)
    names = _unpacked(path, tmp_path / "out")
    root = f"{handout.NAME}-{day}/"
    notebooks = sorted(n for n in names if n.endswith(".ipynb"))
    assert notebooks == [f"{root}notebooks/{day}/{day}.ipynb"], notebooks
    for needed in ("helpers/instructor/selfstudy.py", "helpers/build.py", "Makefile", "README.md", "notebooks/GLOSSARY.md",
                   "results/README.md", "requirements.txt", "pyproject.toml"):
        assert f"{root}{needed}" in names, needed
    folder = tmp_path / "out" / f"{handout.NAME}-{day}"
    assert handout.given_away(folder) == []
    text = _what_a_learner_is_told_is_true(folder)
    assert "day00_environment" not in text and "about 36 hours" not in text
    assert "| 3 | [Build" in text and "2 hours, the one day this handout holds" in text
    # the command refuses a day the course does not have, in one line
    assert handout.main(["16"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: There is no day '16'") and "make handout DAY=3" in err and err.count("\n") == 1, err
    shown = subprocess.run(["make", "-n", "handout", "DAY=3"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert shown.splitlines()[-1].endswith("helpers.instructor.handout 3"), shown


def test_a_readme_the_handout_cannot_rewrite_is_refused():
    with pytest.raises(GradingError, match="REWRITES"):
        handout.readme((REPO / "README.md").read_text().replace("## Two commands", "## Two commands to start"))


def test_reference_values_print_beside_the_learners(tmp_path, monkeypatch):
    monkeypatch.delenv("TVM_COURSE_QUICK", raising=False)
    (tmp_path / "znver4-2cores.json").write_text(json.dumps({
        "machine": "AMD Zen 4 (znver4, 2 cores)", "cpu": "znver4",
        "values": {"day04.tvm_vs_eager": {"value": 3.08, "unit": "x"}}}))
    line = reference.line("day04.tvm_vs_eager", 2.5, "x", root=tmp_path)
    assert line == "tvm vs eager: 2.50x here; reference, at full size: 3.08x on AMD Zen 4 (znver4, 2 cores)"
    assert "no reference machine" in reference.line("day04.unknown", 1.0, "ms", root=tmp_path)
    with pytest.raises(ValueError, match="dayNN|day04"):
        reference.show("tvm_vs_eager", 1.0)


# Shown only where a GPU is present: recorded by a full run on a machine with one (Day 9 without a GPU reads
# results/gpu/ instead).
GPU_ONLY = {"day09.tvm_gpu_vs_fastest_pytorch", "day09.gpu_over_cpu_images_per_s"}


def test_every_reference_key_a_day_shows_is_recorded_at_full_size():
    shown = set()
    for day in grading.assignments():
        text = (REPO / grading.SOURCE / day / f"{day}.ipynb").read_text()
        shown |= set(re.findall(r'reference\.show\(\\?"(day\d\d\.\w+)', text))
    assert shown, "the days show no reference value"
    recorded = {key for path in reference.REFERENCE_ROOT.glob("*.json") for key in json.loads(path.read_text())["values"]}
    missing = sorted(shown - recorded - GPU_ONLY)
    assert not missing, f"no reference machine recorded {missing}: run every day at full size and harvest (docs/maintainers.md)"


def test_the_answer_says_where_the_fused_build_stands_only_where_it_was_measured(tmp_path):
    from helpers import peers
    from helpers.maintainers import fusion_table

    tables = [json.loads((REPO / "results" / source).read_text()) for source in readme.ANSWER_FROM]
    results = tmp_path / "results"
    results.mkdir()
    assert readme.fused_lines(tables, results) == []
    machine = tables[0]["machine"]
    whole = {"timings": {label: {"median_ms": ms, "iqr_ms": 0.1} for label, ms in (
        (fusion_table.FUSED_MEASURED, 2.0), (peers.OPENVINO, 2.5), (peers.ORT, 3.0), (fusion_table.TUNED, 4.0),
        (fusion_table.UNFUSED, 2.2))}}
    other = {"timings": {label: {"median_ms": ms, "iqr_ms": 0.1} for label, ms in (
        (fusion_table.FUSED_MEASURED, 5.0), (peers.ORT, 4.0), (fusion_table.TUNED, 6.0))}}
    (results / f"fusion-{machine['cpu']}-{machine['cores']}cores.json").write_text(
        json.dumps({"whole_models": {"mobilenet_v2": whole, "efficientnet_b0": other}}))
    lines = readme.fused_lines(tables, results)
    assert len(lines) == 2 and "Day 7, section 8" in lines[0], lines
    assert lines[1] == f"  - {readme.machine_name(machine)}: MobileNetV2 1.25x the fastest float32 engine (OpenVINO; the same " \
        "kernels unfused 1.14x), 2.00x tuned TVM; EfficientNet-B0 0.80x the fastest float32 engine (ONNX Runtime), " \
        "1.20x tuned TVM."


def test_the_answer_gives_the_llm_against_llama_cpp_only_where_it_ran_beside_tvm(tmp_path):
    from helpers import generation

    tables = [json.loads((REPO / "results" / source).read_text()) for source in readme.ANSWER_FROM]
    results = tmp_path / "results"
    results.mkdir()
    machine = tables[0]["machine"]
    path = results / f"llm-{machine['cpu']}-{machine['cores']}cores.json"

    def row(rate, low, high, first_ms):
        return {"decode_tokens_per_s": rate, "decode_range": [low, high], "tokens_per_s": rate,
                "tokens_per_s_range": [low, high], "first_token_ms": first_ms,
                "first_token_range_ms": [first_ms * 0.98, first_ms * 1.02], "prompt_tokens": 128}

    path.write_text(json.dumps({"generation": {generation.TVM: row(130, 128, 133, 300)}}))
    assert readme.llm_lines(tables, results) == []   # no llama.cpp beside TVM: no claim
    path.write_text(json.dumps({"generation": {generation.TVM: row(130, 128, 133, 300),
                                               generation.LLAMA_CPP: row(100, 95, 104, 400)},
                                "prompt": {generation.TVM: row(130, 128, 133, 300),
                                           generation.LLAMA_CPP: row(100, 95, 104, 270)}}))
    lines = readme.llm_lines(tables, results)
    assert len(lines) == 2 and "same file" in lines[0]
    assert lines[1] == f"  - {readme.machine_name(machine)}: SmolLM2-135M against llama.cpp decoding 1.30x, faster in " \
        "every round, the prompt of 128 tokens 0.90x, slower in every round."
    path.write_text(json.dumps({"generation": {generation.TVM: row(130, 128, 133, 300),
                                               generation.OPENVINO_GENAI: row(65, 60, 70, 400)}}))
    assert readme.llm_lines(tables, results)[1] == f"  - {readme.machine_name(machine)}: SmolLM2-135M against " \
        f"{generation.OPENVINO_GENAI} decoding 2.00x, faster in every round."
