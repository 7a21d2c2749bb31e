"""Helpers for the "Is it actually faster?" Apache TVM course.

Import the modules a day needs, e.g. ``from helpers import models, build, timing``; importing
``helpers`` itself loads none of them. Three floors, imports pointing down, never in a circle
(``tests/test_architecture.py``):

* what learners import: the modules below, one job each, each saying in its docstring which day
  introduces it;
* ``helpers.maintainers``: the course's own measuring and shipping machinery (the benchmark tables,
  tuning in stages, shipping databases, transfer studies, the int8, transformer, layer and capstone
  runs, GPU recordings), behind ``make benchmark``, ``make capstone`` and docs/maintainers.md;
* ``helpers/instructor/``: what only an instructor or the hub runs (grading, notebook generation, lab
  settings, the hub, the website, the README's generated parts).

The learner's modules, the days whose notebooks import them (``tests/test_architecture.py`` reads the
notebooks and checks this table), and what each owns:

    module           days                          owns
    machine          0-15                          the CPU (LLVM name, features, cores, FMA units, caches), TVM's targets, GPU or not, a smaller CPU class imitated
    models           0-10, 12-14                   torchvision models, example inputs, torch.export to Relax with the weights split out
    build            0-10, 12-14                   compile, load and run on the VirtualMachine, parity with PyTorch, the fusion passes
    ir               0-3, 5-7, 9-10, 12-14         operator histograms, kernel counts, fused functions, a convolution's FLOPs
    envcheck         0                             is this machine ready for the course
    reference        0-14                          what the reference machines measured, printed beside this machine's value
    zoo              11                            the capstone: a model through the whole pipeline, its operator mix
    timing           2, 4-5, 7-14                  one timing method for every backend, its records and tables, runners, busy cores
    config           4-5, 7-15                     quick mode (``pick``), the grading load, where the course lives
    dynamic          4                             one build for every batch size
    peers            4, 7-8, 11-14                 the engines tuned TVM is held against, checked against eager; the tables' labels
    plotting         4-5, 7-9, 11-15               every plot, titled and labelled
    profiling        5, 8, 12, 13                  per-kernel times from the VM's instrument hook
    export           6, 12-14                      a deployable artefact, run in a fresh process
    kernels          7-8, 13-15                    one TensorIR kernel in NCHW and NCHWc, GFLOP/s against the peak, TVM's thread pool
    nchwc            7, 12                         a whole model's convolutions in channel blocks, Day 7's schedule as a search space; a channels-last depthwise one
    databases        7-8, 10, 12-14                which tuning database a model is built with, and why
    tuning           8, 12-14                      MetaSchedule: search, in-process builds, databases, tuned builds (a package)
    transfer_study   8                             reading the studies of a database tuned on another CPU
    rpc_tuning       8                             tuning with candidates measured on other machines
    benchmark        8, 11, 13                     the results files, under their old name (see ``results``)
    gpu              9                             CUDA builds, GPU timing with sync, the recorded GPU measurements
    dynamo           10                            TVM as a ``torch.compile`` backend
    layer_compare    11                            tuned TVM's convolutions against a peer's, layer by layer
    digits           12                            real labelled images (scikit-learn's handwritten digits) and a MobileNetV2-shaped network trained on them, its weights shipped
    accuracy         12                            top-1 accuracy on labelled data with its 95 % interval, answers that differ from a reference
    int8             12                            int8 dot products on VNNI and AVX2, with tensor intrinsics that work here
    quantize         12                            post-training int8 quantization of pointwise convolutions
    bf16             12                            bfloat16 dot products on AVX-512 BF16 (``vdpbf16ps``), with a tensor intrinsic that works here
    bf16_model       12                            a model's convolutions in bfloat16 on that intrinsic, activations stored as bits
    amx              12                            bfloat16 and int8 products on AMX tiles (Intel Xeons), from TIR's calls of LLVM intrinsics
    dispatch         7, 13                         dense convolutions offloaded to PyTorch's oneDNN through call_dps_packed
    block_fusion     7                             a MobileNetV2 (or EfficientNet) block's convolutions as one kernel, cut in bands of rows or chunks of channels
    fused_mobilenet  7                             a whole MobileNetV2 or EfficientNet from those kernels, channels last, as one Relax module
    spinning         13                            TVM builds timed in a process of their own, with TVM's default thread spinning
    errors           14                            the errors the course raises on bad input
    transformer      14                            a small GPT: symbolic length, buckets, decoding with a KV cache
    greedy_decoding  14                            whole greedy generations of the small GPT by every engine, the next token chosen inside the step
    paged_cache      14                            TVM's paged KV cache for the small GPT
    hugging_face     14                            Hugging Face architectures built from a config, through TVM
    qgemv            15                            4-bit group-quantized weights (GGUF's Q4_1), their dequantize-and-multiply as one kernel, its schedules, the read bandwidth
    llm              15                            SmolLM2-135M from its registry package: its GGUF file, shape, tokenizer, a PyTorch reference with its trained weights, the bytes a token reads
    decoder          15                            SmolLM2's decoding step compiled by TVM: hand-written kernels in one Relax function, the KV cache in place, greedy tokens
    generation       15                            whole generations of PyTorch, TVM and llama.cpp in rounds, tokens/s; next-token agreement on real text
    results          -                             the results files in results/ (no day imports it yet: Days 8, 11, 13 use ``benchmark``)
    cache            -                             tuned builds compiled once, then loaded; the test suite's import cache
    capture          3                             stderr capture, C++ included (Days 6, 13 and 14 use it as ``export.capture_stderr``)
"""

import os

# TVM pins its pool's threads to cores. In one process with PyTorch, whose own threads then queue
# behind them, that made a PyTorch conv2d take 16 ms instead of 0.3 ms right after a parallel TVM
# kernel on 2 cores, and a pinned TVM worker stalls on a core another program keeps busy. The
# course runs both libraries side by side, so pinning is off unless the learner sets it.
os.environ.setdefault("TVM_BIND_THREADS", "0")

__version__ = "0.1.0"
