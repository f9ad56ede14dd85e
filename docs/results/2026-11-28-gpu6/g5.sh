#!/usr/bin/env bash
# Device run (one fresh GPU machine, part 1 staged), issue 34, after 99a3678 (a lone adaptive
# sequence decodes plainly until a plain step's cost is known): g4b.sh's zero-acceptance run
# again (Llama-3.1-8B shapes, the random 1B draft model, never accepted), with a second `off`
# engine for the noise floor, after a short untimed pass that builds the kernels.
set -u
t0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
bash .whl/part-2/install-mlx-cuda.sh > /tmp/install.log 2>&1; echo "install rc=$? $(( $(date +%s) - t0 )) s"
[ -d /tmp/l1b ] || python3 -m mlx_nursery make-model /tmp/l1b --preset llama-3.2-1b --dtype bfloat16 > $OUT/make-1b.log 2>&1
[ -d /tmp/l8b ] || python3 -m mlx_nursery make-model /tmp/l8b --preset llama-3.1-8b --dtype bfloat16 > $OUT/make-8b.log 2>&1; echo "models: $(( $(date +%s) - t0 )) s"
variants=(off "draft (adaptive, 4)" "off (second engine)")
args="--model /tmp/l8b --draft-model /tmp/l1b --kv-cache-bytes 8000000000 --workloads chat"
timeout 240 python3 -P bench/speculative.py $args --rounds 1 --tokens 32 --variants "${variants[@]}" > $OUT/pre-5.log 2>&1; echo "pre: rc=$? $(( $(date +%s) - t0 )) s"
timeout 300 python3 -P bench/speculative.py $args --rounds 6 --tokens 128 --variants "${variants[@]}" --trace-costs --out $OUT/zero-accept-5.json > $OUT/zero-accept-5.log 2>&1; echo "zero accept: rc=$? $(( $(date +%s) - t0 )) s"; grep -E "x[0-9]\.[0-9]{2}|plain reads|tok/s$" $OUT/zero-accept-5.log | tail -24
