"""The register tiles of a bf16 or int8 database's products, swept (``python -m helpers.maintainers.shipping
tiles``; issue 50).

MetaSchedule's evolutionary search, at the budgets the course can afford (32-48 trials per kernel), leaves some of
the bf16 and int8 products (``bf16.bf16_space``, ``int8.vnni_space``) with tiles that cannot stay in registers: 7 pixels x 4 channel blocks is 28
sums, plus 4 weight vectors and a broadcast input, 33 of AVX-512's 32 registers; or with the reduction split so
that the sums go to memory and back between its parts. Measured on a Zen 5 (results/HISTORY.md, "A Zen 5, measured
again"), ResNet-50's expanding 1x1 convolution at 56x56 ran 1.3x faster with 7 x 2 sums and its whole reduction innermost.

This tries such tiles on every product in a database: each kernel's best trace replayed with another innermost
tile (its sums and weight vectors fitting in the 32 registers, the channel reduction whole or as tuned), built
and timed alone beside the tuned one, the fastest kept. The result is a database like any other (records are
traces), written beside the source, with every swept kernel's record timed by this sweep.
"""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import numpy as np
import tvm
from tvm.s_tir import meta_schedule as ms

from .. import bf16, int8, timing
from ..tuning.records import copy_records, load_database, mean_secs, measured_records, workloads
from ..tuning.settings import read_settings, save_settings

REGISTERS = 32  # AVX-512's vector registers
MIN_SUMS, MAX_SUMS = 6, 24  # innermost tiles tried: enough sums to hide the instruction's latency, few enough to fit
CANDIDATES = 12  # tiles tried per kernel, besides the tuned one (each with the reduction whole and as tuned)
SAMPLES, SAMPLE_MS = 15, 2.0  # each variant's timing: interleaved samples of back-to-back calls lasting that long


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def fits(pixels: int, blocks: int) -> bool:
    """``pixels`` x ``blocks`` sums, ``blocks`` weight vectors and one broadcast input in the registers."""
    return MIN_SUMS <= pixels * blocks <= MAX_SUMS and pixels * blocks + blocks + 1 <= REGISTERS


def inner_tiles(rows: int, cols: int, blocks: int, limit: int = CANDIDATES) -> list[tuple[int, int, int]]:
    """Innermost (rows, columns, channel blocks) tiles of an output ``rows`` x ``cols`` x ``blocks`` (of 16
    channels) that fit (``fits``), the fewest loads per product first: each step of the reduction loads
    ``blocks`` weight vectors and broadcasts one input per pixel for ``pixels x blocks`` products."""
    tiles = [(r, c, b) for r, c, b in itertools.product(divisors(rows), divisors(cols), divisors(blocks))
             if fits(r * c, b) and r <= 2]
    return sorted(tiles, key=lambda t: ((t[0] * t[1] + t[2]) / (t[0] * t[1] * t[2]), -t[0] * t[1] * t[2]))[:limit]


def _tiles(trace: tvm.s_tir.Trace) -> tuple[list, list]:
    """A product's tiling decisions in trace order: its four-level spatial tiles (batch, rows, columns, channel
    blocks) and its two-level reduction tiles (the channels' pairs last)."""
    spatial, reduction = [], []
    for inst in trace.insts:
        if inst.kind.name == "SamplePerfectTile":
            (spatial if len(inst.outputs) == 4 else reduction).append(inst)
    return spatial, reduction


def _retile(extent: int, tuned: list[int], inner: int) -> list[int]:
    """A four-level tile of ``extent`` with ``inner`` innermost, the outermost level (the cores' share) as close to
    the tuned one as divides what is left."""
    rest = extent // inner
    outer = max(d for d in divisors(rest) if d <= max(1, tuned[0]))
    return [outer, rest // outer, 1, inner]


def variants(trace: tvm.s_tir.Trace) -> list[dict]:
    """Decision changes to try on a tuned product's trace (``{instruction: decision}``), the tuned one first."""
    spatial, reduction = _tiles(trace)
    if len(spatial) != 4 or not reduction:
        return []
    decisions = {inst: [int(v) for v in trace.decisions[inst]] for inst in (*spatial, *reduction)}
    extents = [int(np.prod(decisions[inst])) for inst in spatial]
    channels = reduction[-1]
    whole = [1, int(np.prod(decisions[channels]))]
    out = [{}]
    for rows, cols, blocks in inner_tiles(*extents[1:]):
        change = {inst: _retile(extent, decisions[inst], inner)
                  for inst, extent, inner in zip(spatial[1:], extents[1:], (rows, cols, blocks))}
        out.append({**change, channels: whole})
        if decisions[channels] != whole:
            out.append(change)
    return out


def _apply(record, changes: dict) -> tvm.s_tir.Trace:
    trace = record.trace
    for inst, decision in changes.items():
        trace = trace.with_decision(inst, decision, remove_postproc=False)
    return trace


# A product's packed weight: bf16 bits in 16 x 2 tiles (``bf16.pack_weight``), int8 in 16 x 4 (``int8.pack_weight``).
PRODUCT_WEIGHTS = {("uint16", (bf16.LANES, bf16.PAIR)), ("int8", (int8.LANES, int8.GROUP))}


def is_product(record) -> bool:
    """A kernel with a packed bf16 or int8 weight: what ``bf16.bf16_space`` and ``int8.vnni_space`` tile."""
    return any((str(a.dtype), tuple(int(d) for d in a.shape[-2:])) in PRODUCT_WEIGHTS
               for a in record.args_info if len(a.shape) >= 2)


def _arguments(record) -> list:
    rng = np.random.default_rng(0)
    out = []
    for arg in record.args_info:
        shape, dtype = [int(d) for d in arg.shape], str(arg.dtype)
        if dtype == "uint16":  # bf16 bits of values between 1 and 2
            data = rng.integers(0x3C00, 0x3F80, size=shape).astype(np.uint16)
        elif dtype in ("uint8", "int8", "int32"):
            info = np.iinfo(dtype)
            data = rng.integers(max(info.min, -128), min(info.max, 255) + 1, size=shape).astype(dtype)
        else:
            data = rng.random(shape, dtype=np.float32).astype(dtype)
        out.append(tvm.runtime.tensor(data, tvm.cpu()))
    return out


def sweep_record(record, target: tvm.target.Target) -> tuple[tvm.s_tir.Trace, float, float, int]:
    """The fastest of ``record``'s tile variants that compute the tuned one's bits, timed alone here beside it
    (``timing.measure``, interleaved samples of back-to-back calls): (trace, its milliseconds, the tuned trace's
    milliseconds, variants built)."""
    built = []
    for changes in variants(record.trace):
        trace = _apply(record, changes)
        sch = tvm.s_tir.Schedule(record.workload.mod)
        try:
            trace.apply_to_schedule(sch, remove_postproc=False)
            built.append((trace, tvm.compile(sch.mod, target=target)["main"]))
        except Exception:  # a tile the schedule's other steps do not accept: not a candidate
            continue
    if not built:
        return record.trace, float("nan"), float("nan"), 0
    args = _arguments(record)
    expected = None
    timed = []
    for trace, function in built:
        function(*args)
        result = args[-1].numpy()
        if expected is None:
            expected = result.copy()
        elif not np.array_equal(result, expected):  # the same products in the same order: the same bits
            continue
        timed.append((trace, function))
    medians = [t.median_ms for t in timing.measure(
        {str(i): (lambda function=function: function(*args)) for i, (_, function) in enumerate(timed)},
        repeats=SAMPLES, min_sample_ms=SAMPLE_MS)]
    best = min(range(len(timed)), key=medians.__getitem__)
    return timed[best][0], medians[best], medians[0], len(built)


def sweep_database(source: Path, into: Path, target: tvm.target.Target) -> list[dict]:
    """``source``'s best record per kernel, every bf16 or int8 product's swept (``sweep_record``), written to ``into``
    (``records.copy_records``, as ``prune_database`` writes); one row per swept kernel: its arguments' shapes, the
    tiles built, the tuned and the swept milliseconds."""
    db = load_database(source)  # (which registers the tensor intrinsics its records name)
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(parents=True)
    rows, kept = [], []
    for workload, records in workloads(measured_records(db)):
        record = min(records, key=mean_secs)  # the best per kernel, as a shipped database keeps
        if is_product(record):
            trace, best_ms, tuned_ms, tried = sweep_record(record, target)
            if tried:
                rows.append({"shapes": [[int(d) for d in a.shape] for a in record.args_info], "tried": tried,
                             "tuned_ms": round(tuned_ms, 4), "swept_ms": round(best_ms, 4)})
                print(f"{rows[-1]['shapes'][:2]} -> {rows[-1]['shapes'][-1]}: {tried} tiles, tuned {tuned_ms:.3f} ms, "
                      f"best {best_ms:.3f} ms", flush=True)
                record = ms.database.TuningRecord(trace, workload, [tvm.tirx.FloatImm("float64", best_ms / 1e3)],
                                                  record.target, record.args_info)
        kept.append((workload, [record]))
    copy_records(kept, ms.database.JSONDatabase(work_dir=str(into)))
    save_settings(into, {**read_settings(source),
                         "register_tiles_swept": {"kernels": len(rows), "tiles_built": sum(r["tried"] for r in rows)}})
    return rows
