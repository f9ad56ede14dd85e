#!/usr/bin/env bash
# Device runs 8-12 (2026-11-30, about 07:38-07:41 UTC, a fresh H200 of the pool, the session's last
# device minutes; each ran as one command line, kept here as they ran). Run 8 staged part 1.
# Run 9, the tree at 5a9f9e1 (.whl/part-2 and .whl/test carried): the sequence attention's
# CUDA tests, with the new slices (call-9/cuda-tests.log: 10 of 15 failed, every one a
# float32 case).
source bench/device/prepare.sh; S=$OUT/a-summary.txt; source docs/results/2026-11-30-gpu24/lib.sh; echo "installed: $(elapsed)" >> $S; cuda_tests tests/engine/test_sequence_attention.py -k "slices or mlxs"; cat $S; grep -E "passed|failed|Error" $OUT/cuda-tests.log | tail -5
# Run 10: the same tests on the parent of the slices' commit (its _sequence_attention.py
# copied over the tree's): the same float32 cases failed, so not the slices.
#   cp old_sa.py src/mlx_nursery/engine/_sequence_attention.py; pytest ... -k "mlxs"
# Run 11: the largest differences, float32 (output_tail of the call):
#   causal 0+64:   ours-vs-MLX 1.17e-3, MLX-on-CUDA-vs-MLX-on-CPU 1.08e-3
#   causal 13+5:   ours-vs-MLX 4.17e-4, MLX-vs-CPU 1.8e-7 (MLX's vector kernel; ours, cuBLAS)
#   causal 300+256: ours-vs-MLX 1.7e-5, MLX-vs-CPU 1.9e-4
#   batch [30,7,19]+9: ours-vs-MLX 1.34e-3, MLX-vs-CPU 3.6e-7
# MLX's float32 products on CUDA are TF32: the tests' float32 tolerance (1e-5) was the
# CPU's. With 3e-3 on CUDA (tests/engine/test_sequence_attention.py `close`), run 12: 15
# passed (slices and the MLX comparisons), at the tree of 971f476's slices, before the review
# fix that keys the kernel inputs by the whole query (the same arithmetic).
