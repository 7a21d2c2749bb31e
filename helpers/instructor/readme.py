"""The README's generated parts: the answer to the title, from results/, and the days with their time
(and, in docs/instructors.md, what each day grades; in results/README.md, each machine's tables: ``results_index``).

A learner reads the answer before installing anything, so it must be what the machines measured,
never a number typed in: ``python -m helpers.instructor.readme`` rewrites the blocks between
``<!-- NAME:begin -->`` and ``<!-- NAME:end -->`` from ``results/`` and from each day's opening,
and a test fails when the README differs from what this module makes of them.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import nbformat

from .exercises import read as read_exercises
from .grading import REPO, RELEASE, SOURCE, assignments
from .results_index import CPU_NOTES, MODELS, machine_name, machines

# The benchmark tables the README answers from: the newest run of each CPU kind on the current databases.
ANSWER_FROM = ("benchmark-rocketlake-2cores.json", "benchmark-znver5-2cores.json", "benchmark-znver4-2cores.json",
               "benchmark-znver3-2cores.json")
# A block on lines of its own (a table), or inside a line (a phrase): the markers stay where they are.
BLOCK = re.compile(r"(<!-- (\w+):begin -->\n?).*?(\n?<!-- \2:end -->)", re.S)


def answer(results: Path = REPO / "results") -> str:
    """Tuned TVM against the fastest PyTorch and the fastest float32 engine, per model and machine, from the
    benchmark tables; and OpenVINO's default precision where a table has it (bf16: not a float32 result)."""
    # Here, not at the top: they load TVM and torch (5 s), which the README's other parts and the prose
    # test's import of this module (stated_hours) need not pay.
    from .. import peers, timing  # (5 s of TVM and torch, for this part only)
    from ..maintainers.table import ratios  # (the same)

    tables = [json.loads((results / name).read_text()) for name in ANSWER_FROM]
    header = "| model | " + " | ".join(machine_name(t["machine"]) for t in tables) + " |"
    lines = [header, "| --- |" + " ---: |" * len(tables)]
    against_pytorch, against_engine, engines, lower = [], [], set(), []
    for model, shown in MODELS.items():
        cells = []
        for table in tables:
            row = next(r for r in table["rows"] if r["model"] == model)
            r = ratios(row)
            noisy = any(timing.unreliable(row[label]) for label in (peers.TUNED, r["fastest_pytorch"], r["fastest_engine"]))
            against_pytorch.append(r["tuned_vs_fastest_pytorch"])
            against_engine.append(r["tuned_vs_fastest_engine"])
            engines.add(r["fastest_engine"])
            cells.append(f"{'≈ ' if noisy else ''}**{r['tuned_vs_fastest_pytorch']:.2f}x** / "
                         f"{r['tuned_vs_fastest_engine']:.2f}x ({r['fastest_engine']})")
            for label, error in (row.get("lower_precision") or {}).items():
                lower.append((row[label]["median_ms"] / row[peers.TUNED]["median_ms"], error, peers.precision_of(label),
                              machine_name(table["machine"])))
        lines.append(f"| {shown} | " + " | ".join(cells) + " |")
    low, high = min(against_pytorch), max(against_pytorch)
    unmeasured = [machine_name(t["machine"]) for t in tables if not any(peers.OPENVINO in r for r in t["rows"])]
    not_measured = f" OpenVINO was not measured on {_listed([f'the {m}' for m in unmeasured])}." if unmeasured else ""
    lines += ["", "In bold, tuned TVM's speedup over the fastest PyTorch (`torch.compile` with freezing); then its speed "
              f"against the fastest float32 engine, named; above 1 is faster.{not_measured} Batch 1, float32, medians of "
              "interleaved runs (≈: a timing too noisy to trust); every engine's table is in [results/](results/README.md)."
              + "".join(f" {CPU_NOTES[t['machine']['cpu']]}" for t in tables if t["machine"]["cpu"] in CPU_NOTES), ""]
    lines.append(f"- **Against the fastest PyTorch:** {'faster on every model here' if low > 1 else 'not always faster'}, "
                 f"{low:.2f}x to {high:.2f}x.")
    lines.append(f"- **Against the fastest float32 engine** ({' or '.join(sorted(engines))}): {min(against_engine):.2f}x "
                 f"to {max(against_engine):.2f}x its speed.")
    lines += fused_lines(tables, results)
    if lower:
        precisions = sorted({p for _, _, p, _ in lower})
        where = sorted({m for _, _, _, m in lower})
        lines.append(f"- **Not float32:** on {_listed([f'the {m}' for m in where])} OpenVINO computes in "
                     f"{'/'.join(precisions)} by default, {1 / max(r for r, *_ in lower):.2f}x to "
                     f"{1 / min(r for r, *_ in lower):.2f}x as fast as tuned TVM in float32, its outputs "
                     f"{min(e for _, e, *_ in lower):.0e} to {max(e for _, e, *_ in lower):.0e} away from float32's "
                     "(relative error).")
        lines += tvm_bf16_lines(tables, results)
    lines += llm_lines(tables, results)
    return "\n".join(lines)


def tvm_bf16_lines(tables: list[dict], results: Path) -> list[str]:
    """Where TVM's own bf16 builds (``results/bf16-model-*``, ``helpers.bf16_model``) stand against OpenVINO's
    bf16 and TVM's float32 on the machines of ``tables``, as a bullet with one line per machine; none where none
    was measured."""
    from .. import peers  # (TVM and torch, as in answer)
    from ..maintainers import bf16_model_table as bf16_table  # (the same)

    clauses = []
    for table in tables:
        path = results / f"bf16-model-{table['machine']['cpu']}-{table['machine']['cores']}cores.json"
        if not path.is_file():
            continue
        against_openvino, against_float, products, names = [], [], "`vdpbf16ps`", []
        for model in json.loads(path.read_text())["models"]:
            ms = {r["backend"]: r["median_ms"] for r in model["rows"]}
            openvino = next((b for b in ms if b.startswith(peers.OPENVINO + peers.DEFAULT_PRECISION)), None)
            names.append(MODELS.get(model["model"], model["model"]))
            products = "AMX tiles" if model.get("products", "").startswith("AMX") else products
            against_float.append(ms[bf16_table.TVM_FP32] / ms[bf16_table.TVM_BF16])
            if openvino:
                against_openvino.append(ms[openvino] / ms[bf16_table.TVM_BF16])
        clauses.append(f"  - {machine_name(table['machine'])}, its products on {products}: "
                       + (f"{span(against_openvino)} the speed of OpenVINO's bf16, " if against_openvino else "")
                       + f"{span(against_float)} as fast as TVM in float32 ({_listed(names)}).")
    if not clauses:
        return []
    return ["- **TVM's own bf16 build** (every convolution but the depthwise ones in bf16):", *clauses]


def llm_lines(tables: list[dict], results: Path) -> list[str]:
    """Day 15's LLM against llama.cpp and OpenVINO GenAI on the same file (``results/llm-*``,
    ``helpers.maintainers.llm_roofline``) on the machines of ``tables``: decoding and the prompt, SmolLM2 and the
    1.1B shapes, each with its verdict over the rounds; none where it was not measured with a peer beside it."""
    from .. import generation  # (TVM and torch, as in answer)

    def verdicts(rows: dict, prompt: dict | None) -> str:
        out = []
        for peer in (generation.LLAMA_CPP, generation.OPENVINO_GENAI):
            if peer not in rows:
                continue
            said = f"decoding {generation.verdict(rows[generation.TVM], rows[peer])}"
            if prompt and peer in prompt:
                said += (f", the prompt of {prompt[generation.TVM]['prompt_tokens']} tokens "
                         f"{generation.verdict(prompt[generation.TVM], prompt[peer], 'first')}")
            out.append(f"against {peer.split(' (')[0]} {said}")
        return "; ".join(out)

    clauses = []
    for table in tables:
        path = results / f"llm-{table['machine']['cpu']}-{table['machine']['cores']}cores.json"
        record = json.loads(path.read_text()) if path.is_file() else {}
        small = verdicts(record.get("generation", {}), record.get("prompt"))
        if not small:
            continue
        large = record.get("generation_1b")
        large = verdicts(large["engines"], large.get("prompt")) if large else ""
        clauses.append(f"  - {machine_name(table['machine'])}: SmolLM2-135M {small}"
                       + (f"; at TinyLlama-1.1B's shapes (random weights) {large}" if large else "") + ".")
    if not clauses:
        return []
    return ["- **A real LLM** (Day 15: SmolLM2-135M in 4-bit groups, TVM's own kernels) against the engines people "
            "run such files with, each on the same file (above 1 is faster):", *clauses]


def _listed(names: list[str]) -> str:
    """``names`` as an English list: "A", "A and B", "A, B and C"."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def fused_lines(tables: list[dict], results: Path) -> list[str]:
    """Where MobileNetV2 and EfficientNet-B0 built from the course's own fused kernels (``results/fusion-*``,
    ``helpers.fused_mobilenet``, Day 7) stand against the fastest float32 engine and tuned TVM on the machines of
    ``tables``, as a bullet with one line per machine; none where they were not measured."""
    from .. import peers  # (TVM and torch, as in answer)
    from ..maintainers import fusion_table  # (the same)

    clauses = []
    for table in tables:
        path = results / f"fusion-{table['machine']['cpu']}-{table['machine']['cores']}cores.json"
        wholes = json.loads(path.read_text()).get("whole_models", {}) if path.is_file() else {}
        runs = []
        for name, whole in wholes.items():
            ms = {label: record["median_ms"] for label, record in whole["timings"].items()}
            fused = ms[fusion_table.FUSED_MEASURED]
            engine = min((e for e in (peers.ORT, peers.OPENVINO, peers.FROZEN) if e in ms), key=ms.__getitem__)
            unfused = (f"; the same kernels unfused {ms[engine] / ms[fusion_table.UNFUSED]:.2f}x"
                       if fusion_table.UNFUSED in ms else "")
            runs.append(f"{fusion_table.WHOLE_MODELS.get(name, name)} {ms[engine] / fused:.2f}x the fastest float32 "
                        f"engine ({engine}{unfused}), {ms[fusion_table.TUNED] / fused:.2f}x tuned TVM")
        if runs:
            clauses.append(f"  - {machine_name(table['machine'])}: {'; '.join(runs)}.")
    if not clauses:
        return []
    return ["- **Built from the course's own fused kernels** (channels last, each block one kernel, nothing tuned: "
            "Day 7, section 8), one run each (results/ has the spread over runs):", *clauses]


def span(values: list[float]) -> str:
    """Ratios as a range ("0.77x to 0.85x"), or the one ratio."""
    return f"{min(values):.2f}x to {max(values):.2f}x" if len(values) > 1 else f"{values[0]:.2f}x"


def opening(day: str, course: Path = REPO) -> tuple[str, str]:
    """A day's title and its time, from the first cell of its student notebook."""
    first = nbformat.read(course / RELEASE / day / f"{day}.ipynb", as_version=4).cells[0].source
    title = re.match(r"# Day \d+ — (.+)", first)
    hours = stated_hours(first)
    return (title.group(1).strip() if title else day), (_duration(hours) if hours is not None else "?")


def stated_hours(first_cell_source: str) -> float | None:
    """The hours a day's opening says it takes ('**Time:** about 2 hours', 'about 45 minutes')."""
    match = re.search(r"^\*\*Time:\*\* about (\d+(?:\.\d+)?|one|half an) (hours?|minutes)", first_cell_source, re.M)
    if not match:
        return None
    amount = {"one": 1.0, "half an": 0.5}.get(match.group(1)) or float(match.group(1))
    return amount / 60 if match.group(2) == "minutes" else amount


def _duration(hours: float) -> str:
    return f"{hours * 60:.0f} minutes" if hours < 1 else f"{hours:g} hour{'s' if hours != 1 else ''}"


def total(course: Path = REPO) -> str:
    """The course's time in all, and the shortest and longest day, from the days' openings."""
    hours = [stated_hours(nbformat.read(course / RELEASE / d / f"{d}.ipynb", as_version=4).cells[0].source)
             for d in assignments(course)]
    known = [h for h in hours if h is not None]
    if len(known) != len(hours):
        return "(a day's opening does not say its time)"
    return (f"about {round(sum(known)):.0f} hours in all, over {len(known)} days of {_duration(min(known))} "
            f"to {_duration(max(known))} each")


def days(course: Path = REPO) -> str:
    """The days, one line each with their time, linked to the learner's notebooks."""
    lines = ["| day | what you do | time |", "| ---: | --- | --- |"]
    for day in assignments(course):
        title, time = opening(day, course)
        lines.append(f"| {int(day[3:5])} | [{title}]({RELEASE}/{day}/{day}.ipynb) | {time} |")
    return "\n".join(lines)


def exercise_table(course: Path = REPO) -> str:
    """Each day's exercises with their points, from the sources' exercise headings."""
    lines = ["| day | exercises (points) |", "| ---: | --- |"]
    for day in assignments(course):
        found = read_exercises(nbformat.read(course / SOURCE / day / f"{day}.ipynb", as_version=4))
        listed = "; ".join(f"{ex.title} ({ex.points}{', written, graded by you' if ex.manual else ''})" for ex in found)
        lines.append(f"| {int(day[3:5])} | {listed} |")
    return "\n".join(lines)


# Each generated file, and the blocks it holds.
FILES = {"README.md": {"answer": answer, "days": days, "total": total},
         "docs/instructors.md": {"exercises": exercise_table},
         "results/README.md": {"machines": machines}}


def generated(name: str) -> str:
    """The file ``name`` (a key of ``FILES``) as it must read: its blocks made anew."""
    return render((REPO / name).read_text(), {block: make() for block, make in FILES[name].items()})


def render(text: str, made: dict[str, str]) -> str:
    """``text`` with each generated block replaced by what was made for it."""
    def fill(match: re.Match) -> str:
        name = match.group(2)
        if name not in made:
            raise KeyError(f"the README has a block {name!r} this module does not make")
        begin, end = match.group(1), match.group(3).lstrip("\n")
        return f"{begin}{made[name]}\n{end}" if begin.endswith("\n") else f"{begin}{made[name]}{end}"

    return BLOCK.sub(fill, text)


def main() -> int:
    for name in FILES:
        path = REPO / name
        text, new = path.read_text(), generated(name)
        path.write_text(new)
        print(f"{name}: generated blocks " + ("rewritten" if new != text else "already up to date"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
