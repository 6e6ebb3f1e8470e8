#!/usr/bin/env bash
# Every suite on CUDA against the JAX reference on the same GPU, at JAX's default precision (TF32 on NVIDIA GPUs of
# compute capability >= 8.0) and at highest (float32): issue 32's GPU measurement. Needs a CUDA torch build and
# jax[cuda] in .venv (make setup CONSTRAINTS=<yours>); no network. Writes $OUT/<suite>-<precision>/ (each suite's
# own summary.md, CSVs, result.json), $OUT/machine.txt and $OUT/exit_codes.txt; OUT defaults to runs/gpu (git-ignored).
#
#   make gpu-check RUNS=reports          both precisions into reports/gpu/, the published reports (about 8 minutes
#                                        on one H100)
#   tools/gpu_check.sh default           one precision into runs/gpu/ (fits a 10-minute call)
#
# Exit 0 when every suite passed, 1 when one failed (a finding: its summary says which check and why), 2 when the
# machine cannot run it (no CUDA for torch, or JAX not on the GPU).
set -u
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-runs/gpu}
PRECISIONS=${*:-default highest}

"$PY" - <<'PYEOF' || exit 2
import sys
import jax, torch
if not torch.cuda.is_available():
    sys.exit("gpu_check: torch sees no CUDA device (a CUDA build of torch is needed)")
if jax.default_backend() != "gpu":
    sys.exit(f"gpu_check: JAX runs on {jax.default_backend()}, not a GPU (install jax[cuda])")
PYEOF

mkdir -p "$OUT"
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
  nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader 2>/dev/null
  "$PY" -c "import jax, torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, '|', 'jax', jax.__version__, jax.devices())"
} > "$OUT/machine.txt"

status=0
: > "$OUT/exit_codes.txt"
run() {   # name, then the command's arguments
  local name=$1; shift
  local started=$SECONDS
  "$PY" -m parity "$@" --out "$OUT/$name" --quiet
  local code=$?
  echo "$name: exit $code ($((SECONDS - started)) s): python -m parity $*" | tee -a "$OUT/exit_codes.txt"
  if [ "$code" -gt "$status" ]; then status=$code; fi
}
for precision in $PRECISIONS; do
  run "cartpole-$precision" check --device cuda --reference-precision "$precision"
  run "lm-$precision" check --task lm --device cuda --reference-precision "$precision"
  run "int8-$precision" int8 --device cuda --reference-precision "$precision"
done
[ "$status" -le 2 ] || status=2          # 3 (the suite crashed) reads as "could not run" here
exit "$status"
