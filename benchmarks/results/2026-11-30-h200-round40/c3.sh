#!/bin/bash
# Round 40, call 3 (one H200; carries out/V8.tar.gz): P, the working tree (V8 with the preprocess taking
# four rows a lane group, their loads issued together), full 9.0a build; V8 (dfb7719) kernels-only bf16
# d64/d128/d256 build in /tmp/V8 beside it; kernels.py V8 then P (the preprocess's kernel time);
# memcheck over sanitize39.py; the full GPU suite on P; the sweep's backward rows (--rounds 3, cuDNN).
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
R37=benchmarks/results/2026-11-30-h200-round37
R39=benchmarks/results/2026-11-30-h200-round39
PY=$(command -v python3)
KALL='sm90_fwd_bf16_hdim64*,sm90_fwd_bf16_hdim128*,sm90_fwd_bf16_hdim256*,sm90_bwd_bf16_hdim64*,sm90_bwd_bf16_hdim128*,sm90_bwd_bf16_hdim256*'
rm -rf /tmp/V8 && mkdir -p /tmp/V8 && tar -xzf out/V8.tar.gz -C /tmp/V8 && rm -f /tmp/V8/flashattn/_C*.so
(cd /tmp/V8 && FLASHATTN_KERNELS_ONLY="$KALL" MAX_JOBS=4 $PY setup.py build_ext --inplace > /tmp/buildV8.log 2>&1; echo "build V8 rc $? at ${SECONDS}s") &
rm -f flashattn/_C*.so
FLASHATTN_FORCE_BUILD=1 MAX_JOBS=14 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build P done at ${SECONDS}s"; grep "flashattn build:" "$OUT/build.log" | tail -1 | cut -c1-200
wait
grep -c "kPreprocessRows" /tmp/V8/csrc/sm80/bwd_kernel.cuh csrc/sm80/bwd_kernel.cuh
for t in V8 P V8 P; do
  D=/tmp/V8; [ $t = P ] && D=$PWD
  (cd /tmp && PYTHONPATH=$D:$OLDPWD timeout 40 $PY $OLDPWD/$R37/kernels.py --hdims=64,128,256 --only=flashattn 2>&1 | grep -v Warn >> "$OUT/kernels_$t.log"; echo "kernels $t at ${SECONDS}s")
  grep -h -E "^D=|dot_do_o" "$OUT/kernels_$t.log" | tail -18 | paste - - | cut -c1-150
done
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONPATH=$PWD timeout 90 $CS --tool memcheck $PY $R39/sanitize39.py > "$OUT/memcheck.log" 2>&1
echo "memcheck rc $? at ${SECONDS}s: $(grep -E 'ERROR SUMMARY|calls completed' "$OUT/memcheck.log" | tr '\n' ' ')"
timeout 290 $PY -m pytest tests -m "gpu and not slow" -n 12 -q -p no:cacheprovider -ra > "$OUT/tests.log" 2>&1
echo "tests rc $? at ${SECONDS}s"; tail -1 "$OUT/tests.log" | cut -c1-200; grep -E "^FAILED|^ERROR" "$OUT/tests.log" | head -20 | cut -c1-250
timeout $((592 - SECONDS)) $PY -m benchmarks sweep --passes bwd --headdims 64,128,256 --seqlens 2048,8192 --dtypes bf16 \
  --backends flashattn,flashattn_det,cudnn --rounds 3 --memory-seqlens '' --train-memory-seqlens '' \
  --out "$OUT/sweep" > "$OUT/sweep.log" 2>&1
echo "sweep rc $? at ${SECONDS}s"
sed -n '/^### bf16/,$p' "$OUT/sweep/results.md" 2>/dev/null | cut -c1-200 | head -18
