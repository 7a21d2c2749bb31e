"""bfloat16 and int8 matrix products on AMX tiles (Intel Xeons from Sapphire Rapids on), written in TensorIR.

AMX gives each core eight tile registers of up to 16 rows x 64 bytes and one instruction, ``tdpbf16ps``,
that multiplies a 16 x 32 tile of bfloat16 by a 32 x 16 one and adds the 16 x 16 float32 result into a
third tile: 8,192 multiply-adds, where ``vdpbf16ps`` (``helpers.bf16``) does 32. It is what OpenVINO's and
oneDNN's bf16 run on such a CPU.

TVM 0.27 has no AMX schedule or tensor intrinsic, but its TIR can call any LLVM intrinsic
(``T.call_llvm_intrin``), which is all a kernel needs:

* ``ldtilecfg`` loads the tiles' shapes (a 64-byte configuration) on a thread before any tile is used;
  here a constant linked into the kernel with ``pragma_import_llvm``, as ``helpers.bf16`` links its
  instruction;
* ``tileloadd64`` and ``tilestored64`` move a tile between memory and a tile register, a row stride apart;
* ``tdpbf16ps`` multiplies and adds; ``tilerelease`` hands the tiles back.

The weights are packed as for ``vdpbf16ps`` (``bf16.pack_weight``: ``[N/16, K/2, 16, 2]``): a 16 x 16 x 2 slice
of it is exactly the right-hand tile ``tdpbf16ps`` reads, 64 contiguous bytes per row.

Linux lends a process the tiles' 8 KB of state only when asked; without it the first tile instruction kills
the process with SIGILL. The course's kernels ask themselves before they first load a configuration (so a library
exported with them runs in any process); ``request_tiles`` asks from Python, with a clear error where Linux refuses.

A bf16 model's convolutions (``bf16_model``) go onto the tiles through two tensor intrinsics that each cover a
whole reduction (``product_intrinsic``, ``conv_intrinsic``), the sums staying in tile registers throughout; the
int8 model's 1x1 convolutions (``quantize``) through the first, in integers (``INT8``: ``tdpbusd``, uint8 by int8
into int32 sums, on ``int8.pack_weight``'s 16 x 4 tiles). Loading the tiles' configuration costs 50 ns on a
Xeon, so it is loaded only where ``sttilecfg`` (5 ns) says the thread's tiles hold another.
``schedule_products`` schedules them all by hand when a module is prepared for a CPU with AMX
(``tuning.tasks.prepare``).

Measured by ``python -m helpers.maintainers.benchmark bf16``, ``bf16-model`` and ``int8`` on CPUs with AMX (issue 50).

Introduced on Day 12.
"""

from __future__ import annotations

import ctypes
import dataclasses
import platform

import tvm
from tvm.script import tirx as T

from .bf16 import LANES, PAIR
from .errors import CourseError
from .nchwc import inline_epilogue, split_by_rows

ROWS, COLS_BYTES = 16, 64  # a tile: at most 16 rows of 64 bytes (32 bf16 or 16 float32)
K_STEP = 32  # bfloat16 values along the reduction per tdpbf16ps (a row of the left tile)
BLOCK_ROWS = 2 * ROWS  # each step computes two tiles of output rows against one tile of columns
_C0, _C1, _A0, _A1, _B, _A0_TAIL, _A1_TAIL, _B_TAIL = range(8)  # the eight tile registers' roles
_ARCH_PRCTL, _GET_PERM, _REQ_PERM, _XTILEDATA = 158, 0x1022, 0x1023, 18  # Linux x86-64's arch_prctl


@dataclasses.dataclass(frozen=True)
class Kind:
    """What a tile product multiplies: the element types, how many reduction values a weight tile packs per column
    (``group``: 2 bf16 or 4 int8, in 4 bytes), the sums' type and the instruction (``tdpbf16ps`` or ``tdpbusd``)."""

    name: str
    left: str  # the activations' dtype in the kernel (bf16 as its bits)
    right: str  # the packed weight's dtype
    group: int
    sums: str
    instruction: str
    feature: str  # the target feature that has the instruction

    @property
    def k_step(self) -> int:
        """Reduction values per instruction: a left tile's row of 64 bytes."""
        return COLS_BYTES // self.element_bytes

    @property
    def element_bytes(self) -> int:
        """Bytes per value: ``group`` values fill one 4-byte column of a weight tile."""
        return 4 // self.group

    def product(self, a, w):
        """One multiply-add's product in the sums' type, for the tensor intrinsic's description."""
        if self.name == "int8":
            return T.Cast("int32", a) * T.Cast("int32", w)
        return T.reinterpret("float32", T.shift_left(T.Cast("uint32", a), T.uint32(16))) \
            * T.reinterpret("float32", T.shift_left(T.Cast("uint32", w), T.uint32(16)))


BF16 = Kind("bf16", "uint16", "uint16", PAIR, "float32", "llvm.x86.tdpbf16ps", "amx-bf16")
INT8 = Kind("int8", "uint8", "int8", 4, "int32", "llvm.x86.tdpbusd", "amx-int8")


def has_amx(target: tvm.target.Target, kind: Kind = BF16) -> bool:
    """True when ``target``'s CPU has AMX tiles with ``kind``'s products (bf16 or int8: Intel Xeons from Sapphire
    Rapids on have both)."""
    return all(tvm.target.codegen.target_has_features(f, target) for f in ("amx-tile", kind.feature))


def kinds_on(target: tvm.target.Target) -> tuple[Kind, ...]:
    """The kinds of tile product ``target``'s CPU has (none without AMX)."""
    return tuple(kind for kind in (BF16, INT8) if has_amx(target, kind))


def without_tiles(target: tvm.target.Target) -> tvm.target.Target:
    """``target`` with its AMX switched off: its bf16 convolutions then run on ``vdpbf16ps`` (for a comparison
    in one run of what the tiles buy)."""
    kept = [str(f) for f in target.attrs.get("mattr", []) if "amx" not in str(f)]
    return tvm.target.Target({"kind": "llvm", "mcpu": str(target.attrs["mcpu"]), "num-cores": int(target.attrs["num-cores"]),
                              "mattr": kept + ["-amx-tile", "-amx-bf16", "-amx-int8"]})


def request_tiles() -> None:
    """Ask Linux for this process's permission to use AMX tiles (idempotent; needed once per process before
    a kernel of ``matmul_amx`` runs). Raises ``CourseError`` where it is refused or not Linux on x86-64."""
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        raise CourseError(f"AMX tiles are requested from Linux on x86-64; this is {platform.system()} on {platform.machine()}.")
    libc = ctypes.CDLL(None, use_errno=True)
    granted = ctypes.c_uint64(0)
    if libc.syscall(_ARCH_PRCTL, _GET_PERM, ctypes.byref(granted)) == 0 and granted.value & (1 << _XTILEDATA):
        return
    if libc.syscall(_ARCH_PRCTL, _REQ_PERM, _XTILEDATA) != 0:
        raise CourseError(f"Linux refused this process the AMX tiles (arch_prctl errno {ctypes.get_errno()}): "
                          "the kernel is older than 5.16, or the CPU or the virtual machine does not offer AMX.")


def _config_bytes(shapes: list[tuple[int, int]]) -> bytes:
    """The 64-byte tile configuration (palette 1) of tiles 0-7 of ``shapes`` (rows, bytes per row); a tile with
    no rows or no bytes is left unconfigured."""
    config = bytearray(64)
    config[0] = 1
    for tile, (rows, row_bytes) in enumerate(shapes):
        if rows and row_bytes:
            config[16 + 2 * tile:18 + 2 * tile] = row_bytes.to_bytes(2, "little")
            config[48 + tile] = rows
    return bytes(config)


def tile_config(k: int) -> bytes:
    """The tile configuration of ``matmul_amx`` for a reduction of ``k``: two 16-row tiles of sums, two of inputs,
    one of weights, and tails of the same for the last ``k % 32`` values of the reduction."""
    tail = k % K_STEP
    return _config_bytes([(ROWS, COLS_BYTES)] * 4 + [(K_STEP // PAIR, COLS_BYTES)] + [(ROWS, 2 * tail)] * 2
                         + [(tail // PAIR, COLS_BYTES)])


def matmul_amx(m: int, n: int, k: int) -> tvm.IRModule:
    """``C[m, n] = sum_k A[m, k] * W[n, k]`` in float32 on AMX tiles, a module whose ``main(A, W, C)`` writes ``C``:
    ``A`` ``[m, k]`` bfloat16 bits, ``W`` packed ``[n/16, k/2, 16, 2]`` (``bf16.pack_weight``), both ``uint16``.

    Each parallel task takes 32 rows of ``C`` and walks its columns 16 at a time: two 16 x 16 float32 tiles
    of sums stay in tile registers across the whole reduction, 32 values of it per ``tdpbf16ps`` (a last,
    shorter step takes ``k % 32``). Where ``m`` is not a multiple of 32 the last task starts 32 rows from
    the end, recomputing rows another task also writes (with the same values)."""
    if m < BLOCK_ROWS or n % LANES or k % PAIR:
        raise CourseError(f"matmul_amx needs m >= {BLOCK_ROWS}, n a multiple of {LANES} and k of {PAIR}; "
                          f"got m={m}, n={n}, k={k}.")
    name = f"course_amx_matmul_tiles_{k % K_STEP}"
    ir = _ensure_config_ir(name, tile_config(k))
    steps, tail = k // K_STEP, k % K_STEP
    tasks = (m + BLOCK_ROWS - 1) // BLOCK_ROWS
    half = k // PAIR  # rows of a packed weight block

    @T.prim_func(s_tir=True, check_well_formed=False)
    def main(A: T.Buffer((m, k), "uint16"), W: T.Buffer((n // LANES, half, LANES, PAIR), "uint16"),
             C: T.Buffer((m, n), "float32")):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        with T.attr(T.int32(0), "pragma_import_llvm", ir):
            for task in T.parallel(tasks):
                T.evaluate(T.call_extern("void", name))
                top = T.min(task * BLOCK_ROWS, m - BLOCK_ROWS)
                for col in T.serial(n // LANES):
                    T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tilezero", T.uint8(_C0)))
                    T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tilezero", T.uint8(_C1)))
                    for step in T.serial(steps):
                        T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.uint8(_A0),
                                   A.access_ptr("r", offset=top * k + step * K_STEP), T.int64(2 * k)))
                        T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.uint8(_A1),
                                   A.access_ptr("r", offset=(top + ROWS) * k + step * K_STEP), T.int64(2 * k)))
                        T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.uint8(_B),
                                   W.access_ptr("r", offset=(col * half + step * (K_STEP // PAIR)) * LANES * PAIR),
                                   T.int64(COLS_BYTES)))
                        T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tdpbf16ps", T.uint8(_C0), T.uint8(_A0), T.uint8(_B)))
                        T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tdpbf16ps", T.uint8(_C1), T.uint8(_A1), T.uint8(_B)))
                    if tail > 0:
                        T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.uint8(_A0_TAIL),
                                   A.access_ptr("r", offset=top * k + steps * K_STEP), T.int64(2 * k)))
                        T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.uint8(_A1_TAIL),
                                   A.access_ptr("r", offset=(top + ROWS) * k + steps * K_STEP), T.int64(2 * k)))
                        T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.uint8(_B_TAIL),
                                   W.access_ptr("r", offset=(col * half + steps * (K_STEP // PAIR)) * LANES * PAIR),
                                   T.int64(COLS_BYTES)))
                        T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tdpbf16ps", T.uint8(_C0), T.uint8(_A0_TAIL),
                                                      T.uint8(_B_TAIL)))
                        T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tdpbf16ps", T.uint8(_C1), T.uint8(_A1_TAIL),
                                                      T.uint8(_B_TAIL)))
                    T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tilestored64", T.uint8(_C0),
                               C.access_ptr("w", offset=top * n + col * LANES), T.int64(4 * n)))
                    T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tilestored64", T.uint8(_C1),
                               C.access_ptr("w", offset=(top + ROWS) * n + col * LANES), T.int64(4 * n)))
                T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tilerelease"))

    return tvm.IRModule({"main": main})


# ------------------------------------------------------------------ a model's convolutions on tiles

def _ensure_config_ir(name: str, config: bytes) -> str:
    """LLVM IR of ``name()``: load ``config`` into the tiles unless it is the one loaded already (``sttilecfg``
    reads the tiles' current shapes: another kernel, ours or a library's, may have changed them on this thread).
    Before its first load it asks Linux for the tiles (``arch_prctl``; asked again, nothing changes), so a
    library exported with these kernels runs in any process."""
    data = "".join(f"\\{b:02X}" for b in config)
    return f"""
@{name}_data = private unnamed_addr constant [64 x i8] c"{data}", align 64
declare void @llvm.x86.ldtilecfg(ptr)
declare void @llvm.x86.sttilecfg(ptr)
declare i64 @syscall(i64, ...)
define linkonce_odr void @{name}() alwaysinline {{
entry:
  %now = alloca [64 x i8], align 64
  call void @llvm.x86.sttilecfg(ptr %now)
  %a = load <8 x i64>, ptr %now, align 64
  %b = load <8 x i64>, ptr @{name}_data, align 64
  %same = icmp eq <8 x i64> %a, %b
  %bits = bitcast <8 x i1> %same to i8
  %all = icmp eq i8 %bits, -1
  br i1 %all, label %done, label %load
load:
  %granted = call i64 (i64, ...) @syscall(i64 {_ARCH_PRCTL}, i64 {_REQ_PERM}, i64 {_XTILEDATA})
  call void @llvm.x86.ldtilecfg(ptr @{name}_data)
  br label %done
done:
  ret void
}}
"""


def _load(tile: int, buffer, offset, stride_bytes):
    """``tileloadd64``: rows of ``buffer`` from ``offset`` (in elements), ``stride_bytes`` apart, into ``tile``."""
    return T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.uint8(tile), buffer.access_ptr("r", offset=offset),
                              stride_bytes)


@T.macro
def _sums_zero(blocks):
    """Tiles 0 (and 1, where ``blocks`` is 2) of sums set to zero. Each call of an intrinsic is a whole reduction,
    so its sums start at zero in the tiles rather than from the local buffer, which holds only the zeros the
    reduction's init has just written: loading them back right behind those vector stores stalled."""
    T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tilezero", T.uint8(0)))
    if blocks == 2:
        T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tilezero", T.uint8(1)))


@T.macro
def _sums_out(C, sc, blocks):
    """Tiles 0 (and 1) of sums back into ``C``."""
    T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tilestored64", T.uint8(0), C.access_ptr("w"),
                                  T.Cast("int64", sc) * T.int64(4)))
    if blocks == 2:
        T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tilestored64", T.uint8(1), C.access_ptr("w", offset=LANES),
                                      T.Cast("int64", sc) * T.int64(4)))


@T.macro
def _step(instruction, tiles, left, left_at, left_stride, right, right_at, second_at, blocks):
    """One instruction's worth of a product: the inputs into tile ``tiles[0]``, the first 16 columns' weights into
    ``tiles[1]`` (and the second's into ``tiles[2]`` where ``blocks`` is 2), each multiplied into its sums' tile."""
    T.evaluate(_load(tiles[0], left, left_at, left_stride))
    T.evaluate(_load(tiles[1], right, right_at, T.int64(COLS_BYTES)))
    T.evaluate(T.call_llvm_intrin("void", instruction, T.uint8(0), T.uint8(tiles[0]), T.uint8(tiles[1])))
    if blocks == 2:
        T.evaluate(_load(tiles[2], right, second_at, T.int64(COLS_BYTES)))
        T.evaluate(T.call_llvm_intrin("void", instruction, T.uint8(1), T.uint8(tiles[0]), T.uint8(tiles[2])))


@T.macro
def _products(instruction, left, left_at, left_stride, right, right_at, second_at, blocks, steps, tail, k_step):
    """One product's whole reduction into the sums' tiles: ``steps`` instructions of ``k_step`` values (tiles 2-4),
    then a ``tail`` (tiles 5-7, configured to its length), the inputs from ``left`` at ``left_at`` (rows
    ``left_stride`` bytes apart), the weights of the first 16 columns from ``right`` at ``right_at`` and of the
    second (``blocks`` 2) at ``second_at``; 16 weight rows of 64 bytes per step."""
    if steps > 0:
        for step in T.serial(steps):
            _step(instruction, (2, 3, 4), left, left_at + step * k_step, left_stride, right,
                  right_at + step * k_step * LANES, second_at + step * k_step * LANES, blocks)
    if tail > 0:
        _step(instruction, (5, 6, 7), left, left_at + steps * k_step, left_stride, right,
              right_at + steps * k_step * LANES, second_at + steps * k_step * LANES, blocks)


def product_config(rows: int, k: int, kind: Kind = BF16) -> bytes:
    """The tiles of ``product_intrinsic``: two ``rows`` x 16 tiles of 32-bit sums (0, 1), a ``rows`` x 64-byte
    tile of inputs (2), two weight tiles of 16 rows (3, 4), and for the last ``k % k_step`` values of the
    reduction an input tile (5) and two weight tiles (6, 7) of that length."""
    tail = k % kind.k_step
    return _config_bytes([(rows, COLS_BYTES)] * 3 + [(kind.k_step // kind.group, COLS_BYTES)] * 2
                         + [(rows, kind.element_bytes * tail)] + [(tail // kind.group, COLS_BYTES)] * 2)


def _configure(rows: int, k: int, kind: Kind) -> tuple[str, str]:
    """The name and LLVM IR of the function an intrinsic calls first: ``product_config``'s tiles, loaded if need be."""
    name = f"course_amx_{kind.name}_tiles_{rows}_{k % kind.k_step}"
    return name, _ensure_config_ir(name, product_config(rows, k, kind))


def product_intrinsic(rows: int, cols: int, k: int, kind: Kind = BF16) -> str:
    """Register (idempotent) and name the tensor intrinsic for ``rows`` x ``cols`` sums of a product over all ``k``
    values: ``C[i, j] += A[i, :] . W[j, :]``, ``A`` ``rows`` x ``k`` a row stride apart, ``W`` packed
    ``[cols/16, k/group, 16, group]`` (``bf16.pack_weight``, ``int8.pack_weight``). Its code keeps the sums in tile
    registers across the whole reduction, from zero (``_sums_zero``: where it is used, ``C`` holds the zeros of
    the reduction's init): ``cols`` is 16 or 32 (one or two tiles of sums), ``rows`` at most 16."""
    from tvm.s_tir import TensorIntrin

    group, k_step, size = kind.group, kind.k_step, kind.element_bytes
    if cols not in (LANES, 2 * LANES) or not 0 < rows <= ROWS or k % group:
        raise CourseError(f"product_intrinsic takes rows 1-16, cols 16 or 32 and k a multiple of {group}; "
                          f"got {rows}, {cols}, {k}.")
    name = f"course_amx_{kind.name}_{rows}x{cols}x{k}"
    configure, ir = _configure(rows, k, kind)
    steps, tail, depth, blocks = k // k_step, k % k_step, k // group, cols // LANES

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, w: T.handle, c: T.handle) -> None:
        sa = T.int32()
        sc = T.int32()
        A = T.match_buffer(a, (rows, k), kind.left, offset_factor=1, strides=[sa, 1])
        W = T.match_buffer(w, (blocks, depth, LANES, group), kind.right, offset_factor=1)
        C = T.match_buffer(c, (rows, cols), kind.sums, offset_factor=1, strides=[sc, 1], scope="local")
        with T.sblock("root"):
            T.reads(C[0:rows, 0:cols], A[0:rows, 0:k], W[0:blocks, 0:depth, 0:LANES, 0:group])
            T.writes(C[0:rows, 0:cols])
            for i, j, r in T.grid(rows, cols, k):
                with T.sblock("update"):
                    vi, vj, vr = T.axis.remap("SSR", [i, j, r])
                    C[vi, vj] = C[vi, vj] + kind.product(A[vi, vr], W[vj // LANES, vr // group, vj % LANES, vr % group])

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, w: T.handle, c: T.handle) -> None:
        sa = T.int32()
        sc = T.int32()
        A = T.match_buffer(a, (rows, k), kind.left, offset_factor=1, strides=[sa, 1])
        W = T.match_buffer(w, (blocks, depth, LANES, group), kind.right, offset_factor=1)
        C = T.match_buffer(c, (rows, cols), kind.sums, offset_factor=1, strides=[sc, 1], scope="local")
        with T.sblock("root"):
            T.reads(C[0:rows, 0:cols], A[0:rows, 0:k], W[0:blocks, 0:depth, 0:LANES, 0:group])
            T.writes(C[0:rows, 0:cols])
            with T.attr(T.int32(0), "pragma_import_llvm", ir):
                T.evaluate(T.call_extern("void", configure))
                _sums_zero(blocks)
                _products(kind.instruction, A, 0, T.Cast("int64", sa) * T.int64(size), W, 0, k * LANES, blocks, steps,
                          tail, k_step)
                _sums_out(C, sc, blocks)

    TensorIntrin.register(name, desc, impl, override=True)
    return name


def schedule_pointwise(sch: tvm.s_tir.Schedule) -> None:
    """A 1x1 convolution in bf16 or int8 (``bf16_model.pointwise_bf16_compute``, ``int8.matmul_u8s8_compute``,
    block "C", channels last) on AMX tiles.

    The cores split the image's rows; each row goes in tiles of up to 16 pixels (the widest that divide the
    width) by 32 output channels (16 where they are not a multiple of 32), whose sums stay in tile registers
    across all input channels (``product_intrinsic``). The element-wise work after the convolution (bias,
    clip, a residual, the rounding to bf16 of what the next convolution reads) is done on each finished
    tile, from the core's L1 cache, before it is written."""
    block = sch.get_sblock("C")
    kind = kind_of(sch.get(block))
    epilogue = inline_epilogue(sch, block)
    b, h, w, n, k = sch.get_loops(block)
    rows, cols, pixels = _tile_rows_and_channels(sch, block, epilogue, (b, h, w), n, (k,))
    sch.tensorize(pixels, product_intrinsic(rows, cols, int(sch.get(k).extent), kind))


def _pixels_per_tile(width: int) -> int:
    """The output pixels along a row that one tile takes: the most, up to 16, that divide the row's ``width`` (a
    ragged last tile would not match the intrinsic)."""
    return max(d for d in range(1, ROWS + 1) if width % d == 0)


def _tile_rows_and_channels(sch: tvm.s_tir.Schedule, block, epilogue: list, rows: tuple, channels, reduction: tuple):
    """What ``schedule_pointwise`` and ``schedule_conv`` share: the output's ``rows`` (batch, row, column loops) and
    ``channels`` split into tiles of up to 16 pixels (the widest that divide the width) by 32 channels (16 where 32
    does not divide them), the tasks ordered (``_order_tasks``) and each tile's sums kept local (``_sums_per_tile``).
    Returns (pixels per tile, channels per tile, the loop over a tile's pixels, for the caller to tensorize)."""
    b, h, w = rows
    width, count = int(sch.get(w).extent), int(sch.get(channels).extent)
    per_tile = _pixels_per_tile(width)
    cols = 2 * LANES if count % (2 * LANES) == 0 else LANES
    tiles, pixels = sch.split(w, [None, per_tile])
    groups, lanes = sch.split(channels, [None, cols])
    last = _order_tasks(sch, block, (b, h, tiles), groups, (pixels, lanes, *reduction))
    _sums_per_tile(sch, block, epilogue, last, pixels)
    return per_tile, cols, pixels


# Split by rows, each core streams all the weights once per row of tiles: ResNet-50's 3x3 convolutions at 7x7
# (4.7 MB of bf16 weights, 49 pixels) ran at 361 GFLOP/s on the Xeon. Where the weights outweigh the input
# (as ``nchwc.ROWS_FIRST_MAX_WEIGHT_RATIO`` decides for float32), the cores split the output channels
# instead, and each keeps its 32 channels' weights in L2 across the rows.
def _order_tasks(sch: tvm.s_tir.Schedule, block, rows: tuple, groups, tile: tuple):
    """Order the loops over tiles, ``rows`` (batch, row, tiles along it) and the output channels' ``groups``, before
    those of a ``tile``, and parallelize the outer ones: by rows, or by channel groups where the weights outweigh
    the input (``nchwc.split_by_rows``). Returns the innermost loop over tiles, under which each is computed."""
    b, h, tiles = rows
    if split_by_rows(sch, block):
        sch.reorder(b, h, tiles, groups, *tile)
        sch.parallel(sch.fuse(b, h))
        return groups
    sch.reorder(groups, b, h, tiles, *tile)
    sch.parallel(groups)
    return tiles


def _sums_per_tile(sch: tvm.s_tir.Schedule, block, epilogue: list, groups, pixels) -> None:
    """The tile's sums in a local buffer, zeroed before its products; the element-wise work after the block done on
    each finished tile before it is written (a bare convolution gets a copy-out stage instead)."""
    out = epilogue[0] if epilogue else sch.cache_write(block, 0, "global")
    for producer in sch.get_producers(out):  # beside the sums, a residual read as bf16 bits: widened where it is read
        if sch.get(producer).name_hint != sch.get(block).name_hint:
            sch.compute_inline(producer)
    sch.reverse_compute_at(out, groups, preserve_unit_loops=True)
    sch.vectorize(sch.get_loops(out)[-1])
    sch.set_scope(block, 0, "local")
    init = sch.decompose_reduction(block, pixels)
    sch.vectorize(sch.get_loops(init)[-1])


def conv_intrinsic(rows: int, cols: int, kernel: tuple[int, int], channels: int, stride: int) -> str:
    """Register (idempotent) and name the tensor intrinsic for ``rows`` output pixels of a row by ``cols`` output
    channels of a convolution (``bf16_model.conv_bf16_compute``): the sums over the kernel's taps and ``channels``
    (even) input channels, ``stride`` apart along the row, kept in tile registers. Each tap is one product as
    ``product_intrinsic``'s: its input tile is the ``rows`` pixels it meets, ``stride`` pixels apart in memory."""
    from tvm.s_tir import TensorIntrin

    kh, kw = kernel
    if cols not in (LANES, 2 * LANES) or not 0 < rows <= ROWS or channels % PAIR:
        raise CourseError(f"conv_intrinsic takes rows 1-16, cols 16 or 32 and even channels; got {rows}, {cols}, {channels}.")
    name = f"course_amx_conv_{rows}x{cols}_{kh}x{kw}x{channels}_s{stride}"
    # A row of taps over few channels (a stem's 3, padded to 4) is one product: a pixel's kw taps x channels
    # values lie side by side in the padded input, and so do their weights, so one tdpbf16ps takes a whole
    # row of the kernel (28 values for a 7x7 stem) instead of one tap (4 values).
    merged = kw > 1 and kw * channels <= K_STEP
    depth = kw * channels if merged else channels
    configure, ir = _configure(rows, depth, BF16)
    steps, tail, half, blocks = channels // K_STEP, channels % K_STEP, channels // PAIR, cols // LANES
    span = (rows - 1) * stride + kw  # the input columns a tile of output pixels reads

    @T.prim_func(s_tir=True)
    def desc(x: T.handle, w: T.handle, c: T.handle) -> None:
        sr = T.int32()
        sp = T.int32()
        sc = T.int32()
        X = T.match_buffer(x, (kh, span, channels), "uint16", offset_factor=1, strides=[sr, sp, 1])
        W = T.match_buffer(w, (blocks, kh, kw, half, LANES, PAIR), "uint16", offset_factor=1)
        C = T.match_buffer(c, (rows, cols), "float32", offset_factor=1, strides=[sc, 1], scope="local")
        with T.sblock("root"):
            T.reads(C[0:rows, 0:cols], X[0:kh, 0:span, 0:channels], W[0:blocks, 0:kh, 0:kw, 0:half, 0:LANES, 0:PAIR])
            T.writes(C[0:rows, 0:cols])
            if kh * kw == 1:  # a 1x1 kernel: its block has no iterators for the taps, only their unit loops
                for i, j, _ry, _rx, rc in T.grid(rows, cols, 1, 1, channels):
                    with T.sblock("update"):
                        vi, vj, vrc = T.axis.remap("SSR", [i, j, rc])
                        C[vi, vj] = C[vi, vj] + BF16.product(X[0, vi * stride, vrc],
                                                             W[vj // LANES, 0, 0, vrc // PAIR, vj % LANES, vrc % PAIR])
            else:
                for i, j, ry, rx, rc in T.grid(rows, cols, kh, kw, channels):
                    with T.sblock("update"):
                        vi, vj, vry, vrx, vrc = T.axis.remap("SSRRR", [i, j, ry, rx, rc])
                        C[vi, vj] = C[vi, vj] + BF16.product(X[vry, vi * stride + vrx, vrc],
                                                             W[vj // LANES, vry, vrx, vrc // PAIR, vj % LANES, vrc % PAIR])

    tap = half * LANES * PAIR  # a tap's weights in one block of 16 output channels
    block_size = kh * kw * tap

    @T.prim_func(s_tir=True)
    def impl(x: T.handle, w: T.handle, c: T.handle) -> None:
        sr = T.int32()
        sp = T.int32()
        sc = T.int32()
        X = T.match_buffer(x, (kh, span, channels), "uint16", offset_factor=1, strides=[sr, sp, 1])
        W = T.match_buffer(w, (blocks, kh, kw, half, LANES, PAIR), "uint16", offset_factor=1)
        C = T.match_buffer(c, (rows, cols), "float32", offset_factor=1, strides=[sc, 1], scope="local")
        with T.sblock("root"):
            T.reads(C[0:rows, 0:cols], X[0:kh, 0:span, 0:channels], W[0:blocks, 0:kh, 0:kw, 0:half, 0:LANES, 0:PAIR])
            T.writes(C[0:rows, 0:cols])
            with T.attr(T.int32(0), "pragma_import_llvm", ir):
                T.evaluate(T.call_extern("void", configure))
                _sums_zero(blocks)
                if merged:  # one product per row of taps: a single step of kw * channels values
                    for ry in T.serial(kh):
                        _products(BF16.instruction, X, ry * sr, T.Cast("int64", sp) * T.int64(2 * stride), W,
                                  ry * kw * tap, block_size + ry * kw * tap, blocks, 0, depth, K_STEP)
                for ry, rx in T.grid(0 if merged else kh, kw):
                    _products(BF16.instruction, X, ry * sr + rx * sp, T.Cast("int64", sp) * T.int64(2 * stride), W,
                              (ry * kw + rx) * tap, block_size + (ry * kw + rx) * tap, blocks, steps, tail, K_STEP)
                _sums_out(C, sc, blocks)

    TensorIntrin.register(name, desc, impl, override=True)
    return name


def schedule_conv(sch: tvm.s_tir.Schedule) -> None:
    """A bf16 convolution with a kernel or a stride (``bf16_model.conv_bf16_compute``, block "C", channels last)
    on AMX tiles: the input padded once (its own parallel pass, one vector of channels at a time), then as
    ``schedule_pointwise``, tiles of output pixels along a row by 16 or 32 channels, their sums over every tap
    and input channel in tile registers (``conv_intrinsic``)."""
    block = sch.get_sblock("C")
    epilogue = inline_epilogue(sch, block)
    (pad,) = sch.get_producers(block)
    n, h, w, c = sch.get_loops(pad)
    sch.parallel(sch.fuse(n, h))
    sch.vectorize(c) if int(sch.get(c).extent) in (2, 4, 8, 16, 32, 64) else None
    b, i, j, o, ry, rx, rc = sch.get_loops(block)
    kernel, depth = (int(sch.get(ry).extent), int(sch.get(rx).extent)), int(sch.get(rc).extent)
    stride = _row_stride(sch, block)
    rows, cols, pixels = _tile_rows_and_channels(sch, block, epilogue, (b, i, j), o, (ry, rx, rc))
    sch.tensorize(pixels, conv_intrinsic(rows, cols, kernel, depth, stride))


def _row_stride(sch: tvm.s_tir.Schedule, block) -> int:
    """The stride along a row of ``conv_bf16_compute``'s block, from the shapes: the padded input's width, the
    kernel's and the output's (``out = (padded - kernel) // stride + 1``; any stride will do for one column)."""
    padded = int(sch.get(block).reads[0].source.shape[2])
    out, kernel = (int(sch.get(loop).extent) for loop in (sch.get_loops(block)[2], sch.get_loops(block)[5]))
    return next((s for s in range(1, padded + 1) if (padded - kernel) // s + 1 == out), 1)


def kind_of(block: tvm.tirx.SBlock) -> Kind | None:
    """The kind of tile product ``block`` computes, from what it reads: bf16 bits by bf16 bits (``BF16``),
    uint8 by int8 (``INT8``); None for anything else."""
    dtypes = sorted(str(r.source.dtype) for r in block.reads)
    return next((kind for kind in (BF16, INT8) if dtypes == sorted([kind.left, kind.right])), None)


def tile_schedule_for(func: tvm.tirx.PrimFunc):
    """``schedule_pointwise`` for a kernel that computes ``bf16_model.pointwise_bf16_compute`` or
    ``int8.matmul_u8s8_compute`` on a 4-D activation, ``schedule_conv`` for one that computes ``conv_bf16_compute``
    (a block "C" reading an activation and a weight packed in tiles of 16 columns, with 5 or 7 loops), None for any
    other kernel, and for one whose tiles would take one pixel (``_pixels_per_tile``: a map of one pixel, as in
    EfficientNet's squeeze-and-excitation, or rows whose width no number from 2 to 16 divides, such as 19): each
    tile would fill one row of its 16, and a tile's loop of one pixel does not match the intrinsic; such a kernel
    keeps its database's schedule."""
    sch = tvm.s_tir.Schedule(func)
    try:
        block = sch.get_sblock("C")
    except tvm.s_tir.ScheduleError:  # (no block of that name)
        return None
    kind = kind_of(sch.get(block))
    if kind is None:
        return None
    shapes = [[int(d) for d in r.source.shape] for r in sch.get(block).reads]
    if len(shapes[0]) != 4 or shapes[1][-2:] != [LANES, kind.group]:
        return None
    loops = sch.get_loops(block)
    if _pixels_per_tile(int(sch.get(loops[2]).extent)) == 1:  # the output's width: tiles of one pixel
        return None
    if len(loops) == 5 and len(shapes[1]) == 4:
        return schedule_pointwise
    return schedule_conv if kind is BF16 and len(loops) == 7 and len(shapes[1]) == 6 else None


def schedule_products(mod: tvm.IRModule, kinds: tuple[Kind, ...] = (BF16,)) -> tvm.IRModule:
    """Schedule each convolution of ``mod`` whose products are of one of ``kinds`` (``kinds_on`` a target) on AMX
    tiles (``tile_schedule_for``), once and for all: marked scheduled, it is no longer tuned, and a database's
    records for it are not used. Other kernels are left."""
    mod = mod.clone()
    for gv, func in list(mod.functions.items()):
        if not isinstance(func, tvm.tirx.PrimFunc) or func.attrs.get("tirx.is_scheduled", False):
            continue
        schedule = tile_schedule_for(func)
        if schedule is None:
            continue
        sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
        if kind_of(sch.get(sch.get_sblock("C"))) not in kinds:
            continue
        schedule(sch)
        mod[gv] = sch.mod["main"].with_attr("tirx.is_scheduled", True)
    return mod
