"""The results index's generated part (``results/README.md``): today's tables of each machine, from ``results/*.json``.

A reader opens ``results/`` for the numbers of a machine like theirs, not for the log of every run
(``results/HISTORY.md``, kept for maintainers). So the index shows, per CPU kind, one small table per kind of
result, each with the date it was measured, the commit that brought its file and the file, and nothing typed:
``python -m helpers.instructor.readme`` writes what ``machines`` makes between the index's
``<!-- machines:begin -->`` and ``<!-- machines:end -->``, as it writes the top-level README's answer, and
``tests/test_readme.py`` fails when the index differs. Each table is read from its JSON with the names the
module that measured it uses (``helpers.maintainers``). The reference machines' names live here, since both
READMEs name them and ``readme``, which writes both, imports this module.

A commit is git's: after committing a new results file, run ``make readme`` again and commit the index.
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
from pathlib import Path

from ..config import REPO

RESULTS = REPO / "results"
# The reference machines, in the order the results index shows them (the top-level README's first).
CPU_NAMES = {"rocketlake": "Intel Xeon with AMX", "znver5": "AMD Zen 5", "znver4": "AMD Zen 4", "znver3": "AMD Zen 3",
             "emeraldrapids": "Intel Xeon (5th generation)"}
# Where LLVM's name for a reference machine would mislead a reader, said once beside it.
CPU_NOTES = {"rocketlake": "LLVM names the Intel Xeon `rocketlake` after the model number its virtual machine shows; "
                           "its instructions are a server Xeon's (AVX-512 BF16, AMX)."}
MODELS = {"mobilenet_v2": "MobileNetV2", "resnet50": "ResNet-50", "efficientnet_b0": "EfficientNet-B0"}
# The kinds of result with a table of their own, in the order a machine's section shows them.
KINDS = {"benchmark": "float32", "bf16-model": "bf16", "int8": "int8", "transformer": "A small GPT (Day 14)",
         "transformer-large": "A transformer of GPT-2 small's sizes", "llm": "SmolLM2-135M, a real LLM in 4-bit groups"}
# <kind>-<cpu>-<cores>cores[-on-<host>].json: a CPU class imitated on the host where "-on-" says so.
FILE = re.compile(r"(?P<kind>transformer-large|transformer|bf16-model|benchmark|int8|llm)-(?P<cpu>[\w-]+?)-"
                  r"(?P<cores>\d+)cores(?:-on-(?P<host>[\w-]+))?\.json")
PEER_HEADER = ["| {first} | fastest PyTorch, ms | fastest engine, ms | TVM, ms | TVM vs fastest PyTorch "
               "| TVM vs fastest engine |", "| --- | --- | --- | --- | ---: | ---: |"]


def machine_name(machine: dict) -> str:
    """A reference machine as a learner reads it: 'AMD Zen 4 (`znver4`, 2 cores)'."""
    cpu = machine["cpu"]
    return f"{CPU_NAMES.get(cpu, cpu)} (`{cpu}`, {machine['cores']} cores)"


def machines(results: Path = RESULTS, index: Path = RESULTS / "README.md") -> str:
    """A section per machine that measured in ``results`` (``CPU_NAMES``' order), with its tables in ``KINDS``'
    order, those of a CPU class it imitated last. ``index``: where to read the commits git cannot give here."""
    found: dict[str, list[tuple[re.Match, dict]]] = {}
    for path in sorted(results.glob("*.json")):
        match = FILE.fullmatch(path.name)
        if match:
            found.setdefault(match["host"] or match["cpu"], []).append((match, json.loads(path.read_text())))
    stated, order = stated_commits(index), list(CPU_NAMES)
    sections = []
    for host in sorted(found, key=lambda cpu: (order.index(cpu) if cpu in order else len(order), cpu)):
        tables = sorted(found[host], key=lambda f: (f[0]["host"] is not None, list(KINDS).index(f[0]["kind"])))
        lines = [f"## {machine_name(tables[0][1]['machine'])}", ""] + ([CPU_NOTES[host], ""] if host in CPU_NOTES else [])
        for match, record in tables:
            name, kind = match.group(0), match["kind"]
            commit = record.get("commit") or commit_of(results / name) or stated.get(name, "unknown")
            imitated = f", imitating `{match['cpu']}`" if match["host"] else ""
            every = name.replace(".json", ".md")
            link = f" ([every column]({every}))" if (results / every).is_file() else ""
            lines += [f"**{KINDS[kind]}{imitated}**, measured {record['measured']}: `{name}`, commit `{commit}`{link}"
                      f"{memory_floor(record) if kind == 'transformer-large' else ''}", "", TABLES[kind](record), ""]
        sections.append("\n".join(lines).rstrip())
    return "\n\n".join(sections)


def commit_of(path: Path) -> str | None:
    """The last commit that changed ``path``, as seven hex digits (of ``%H``: ``%h``'s length depends on the clone);
    None where git cannot say: no repository, a file it does not track, or a shallow clone whose history stops at
    that commit (every file would seem to come from it)."""
    try:
        done = subprocess.run(["git", "log", "-1", "--format=%H", "--", path.name], cwd=path.parent,
                              capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    commit = done.stdout.strip()
    return commit[:7] if commit and commit not in _shallow_boundary(path.parent) else None


@functools.cache
def _shallow_boundary(where: Path) -> frozenset[str]:
    """The commits where a shallow clone's history stops (none in a full clone)."""
    done = subprocess.run(["git", "rev-parse", "--git-path", "shallow"], cwd=where, capture_output=True, text=True)
    shallow = where / done.stdout.strip()
    return frozenset(shallow.read_text().split()) if done.returncode == 0 and shallow.is_file() else frozenset()


def stated_commits(index: Path) -> dict[str, str]:
    """The commit the index states for each file: kept where this checkout lacks the history to say it anew."""
    text = index.read_text() if index.is_file() else ""
    return dict(re.findall(r"`([\w.-]+\.json)`, commit `([0-9a-f]{7,})`", text))


def float32_table(record: dict) -> str:
    """``make benchmark``'s table: per model, tuned TVM against the fastest PyTorch and the fastest engine."""
    from ..peers import TUNED  # (TVM and torch, 5 s: only where the index is made, as in readme.answer)

    return peer_table("model", [(MODELS.get(row["model"], row["model"]), row, TUNED) for row in record["rows"]])


def transformer_table(record: dict) -> str:
    """Day 14's: each prefill bucket and the decoding step, TVM's tuned build against the same peers."""
    from .. import transformer  # (TVM and torch, as in float32_table)

    steps = [(f"prefill, {p['length']} tokens", p["engines"], transformer.TUNED_BUCKET) for p in record["prefill"]]
    return peer_table("step", [*steps, (f"decode after {record['past']}", record["decode"], transformer.DECODE_TUNED)])


def large_table(record: dict) -> str:
    """GPT-2 small's sizes: the decoding step (TVM's fastest build, named) and the prefill, against the same peers."""
    from ..maintainers import transformer_large  # (TVM and torch, as in float32_table)

    fastest_tvm = min((label for label in record["decode"] if label.startswith("TVM")),
                      key=lambda label: record["decode"][label]["median_ms"])
    return peer_table("step", [(f"decode after {record['past']}", record["decode"], fastest_tvm),
                               (f"prefill of {record['prompt']} tokens", record["prefill"], transformer_large.TUNED_PREFILL)])


def memory_floor(record: dict) -> str:
    """The GPT-2-sized decoding step's floor (weights read per token over the bandwidth), said beside its table, and
    the share of it the fastest engine reaches."""
    from ..maintainers import transformer_large  # (TVM and torch, as in float32_table)

    floor = transformer_large.memory_floor_ms(record)
    fastest = min(r["median_ms"] for r in record["decode"].values())
    return f"; a decoding step's memory floor {floor:.1f} ms, the fastest engine at {floor / fastest:.0%} of it"


def peer_table(first: str, rows: list[tuple[str, dict[str, dict], str]]) -> str:
    """One line per (name, engines' records, TVM's label): the fastest PyTorch and the fastest engine, each named,
    against that TVM build, the ratios ``table.ratios`` gives (TVM's build in its "TVM tuned" place)."""
    from ..peers import TUNED  # (TVM and torch, as in float32_table)
    from ..maintainers.table import ratios  # (the same)

    lines = [PEER_HEADER[0].format(first=first), PEER_HEADER[1]]
    for name, engines, candidate in rows:
        r = ratios({**engines, TUNED: engines[candidate]}) if candidate in engines else {}
        pytorch, engine = r.get("fastest_pytorch"), r.get("fastest_engine")
        lines.append(f"| {name} | {_cell(pytorch, engines.get(pytorch))} | {_cell(engine, engines.get(engine))} "
                     f"| {_cell(candidate, engines.get(candidate))} "
                     f"| {_ratio(r.get('tuned_vs_fastest_pytorch'), engines, pytorch, candidate)} "
                     f"| {_ratio(r.get('tuned_vs_fastest_engine'), engines, engine, candidate)} |")
    return "\n".join(lines)


def bf16_table(record: dict) -> str:
    """Per model, TVM's bf16 build against the fastest other bf16 engine and TVM's float32 build."""
    from ..maintainers import bf16_model_table as bf16  # (TVM and torch, as in float32_table)

    return precision_table("bf16", [(MODELS.get(m["model"], m["model"]), m["rows"], bf16.TVM_BF16, bf16.other_bf16(m),
                                     bf16.TVM_FP32) for m in record["models"]])


def int8_table(record: dict) -> str:
    """Day 12's MobileNetV2: TVM's int8 build against the fastest other int8 engine and TVM's float32 build."""
    from ..maintainers import int8_table as int8  # (TVM and torch, as in float32_table)

    ms = {r["backend"]: r["median_ms"] for r in record["rows"]}
    other = min((b for b in ms if "int8" in b and not b.startswith(int8.TVM_INT8)), key=ms.__getitem__)
    return precision_table("int8", [(MODELS["mobilenet_v2"], record["rows"], int8.TVM_INT8, other, int8.TVM_FP32)])


def precision_table(precision: str, rows: list[tuple[str, list[dict], str, str, str]]) -> str:
    """One line per (model, its rows with quartiles, TVM's label in ``precision``, the fastest other engine's, TVM's
    float32 label): the three medians (quartile spread) and TVM's ratios against the other two."""
    lines = [f"| model | TVM {precision}, ms | fastest other {precision} engine, ms | TVM float32, ms "
             f"| TVM {precision} vs the other | TVM {precision} vs TVM float32 |", "| --- | --- | --- | --- | ---: | ---: |"]
    for name, found, tvm, other, fp32 in rows:
        records = {r["backend"]: {"median_ms": r["median_ms"], "iqr_ms": r["q3_ms"] - r["q1_ms"]} for r in found}
        lines.append(f"| {name} | {_cell(tvm, records[tvm])} | {_cell(other, records[other])} | {_cell(fp32, records[fp32])} "
                     f"| {_ratio(records[other]['median_ms'] / records[tvm]['median_ms'], records, other, tvm)} "
                     f"| {_ratio(records[fp32]['median_ms'] / records[tvm]['median_ms'], records, fp32, tvm)} |")
    return "\n".join(lines)


def _cell(label: str | None, record: dict | None) -> str:
    """``label 4.91 (0.49)``: a median and its spread in ms, marked where the spread is noise; a dash where absent."""
    if record is None:
        return "—"
    digits = 2 if record["median_ms"] >= 1 else 3
    return f"{label} {_mark(record)}{record['median_ms']:.{digits}f} ({record['iqr_ms']:.{digits}f})"


def _ratio(value: float | None, records: dict[str, dict], *labels: str | None) -> str:
    """``1.92x``, marked where either timing behind it is noise; a dash where there is none."""
    if value is None:
        return "—"
    return f"{''.join(sorted({_mark(records[label]) for label in labels if label in records}))}{value:.2f}x"


def _mark(record: dict) -> str:
    from .. import timing  # (TVM and torch, as in float32_table)
    from ..maintainers.report import UNRELIABLE_MARK  # (the same)

    return UNRELIABLE_MARK if timing.unreliable(record) else ""


def llm_table(record: dict) -> str:
    """SmolLM2's: the 4-bit products' share of the read bandwidth, and each engine's whole generation."""
    from ..maintainers import llm_roofline  # (TVM and torch, as in float32_table)

    return llm_roofline.summary(record)


TABLES = {"benchmark": float32_table, "bf16-model": bf16_table, "int8": int8_table, "transformer": transformer_table,
          "transformer-large": large_table, "llm": llm_table}
