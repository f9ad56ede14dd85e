#!/usr/bin/env bash
# Prepared for the next session, not run: device run 3, right after next.sh on the same
# machine (the kernels built; .whl/part-2 and .whl/test carried): first the ragged attention's
# CUDA test, whose new case takes the one-kernel form as MLX compiles it (decisions/0060);
# then the second of each pair next.sh began (the default, then the
# decode prelude in the batch's step), prefill chunks of up to 1,024 tokens against 512,
# then a lone greedy stream. c3.sh follows.
set -u
source bench/device/prepare.sh
S=$OUT/a-summary.txt
source docs/results/2026-11-29-gpu19/lib.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/pt .whl/test/*.whl > /dev/null 2>&1
PYTHONPATH=/tmp/pt:$PYTHONPATH timeout 120 python3 -m pytest -q -p no:cacheprovider --noconftest \
  -o addopts="-ra" tests/engine/test_ragged_cache.py -k kernel_equals > $OUT/cuda-tests.log 2>&1
echo "== cuda tests: rc=$? $(elapsed)" >> $S
tail -3 $OUT/cuda-tests.log >> $S
A="--model /tmp/l8b --input-len 500:1000 --mode host --launch"
C="$A --clients 32 --output-len 64:192 --duration 20"
sa c32-again 75 $C
sa c32-prelude-again 75 $C --prelude-batches
sa c32-chunk1024 80 $C --prefill-step-size 1024
sa c32-chunk512 75 $C
sa one 60 $A --clients 1 --output-len 128 --temperature 0 --duration 15
cd /tmp/j && tar -czf $OUT/json2.tgz *.json && cd - > /dev/null
cat $S
