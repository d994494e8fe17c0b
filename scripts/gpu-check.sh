#!/usr/bin/env bash
# The GPU check (issue 40): on one GPU machine, the gpu tests (tests/test_gpu.py: every pipeline
# and mixed precision on CUDA past every callback, every method through the device pipeline,
# the criterion against the CPU, a kill and resume, a one-process torchrun, evaluation features
# against the CPU), then the GPU benchmarks (benchmarks/gpu_check.py: training against its compute
# bound per pipeline, the criterion, feature extraction, the probes; then the ImageNet protocol's
# wall time predicted from those rates, benchmarks/time_to_answer.py). About 6 minutes on one
# H100 or H200. Writes OUT/gpu-tests.log, OUT/gpu-check.json and .md (the table), and
# OUT/time_to_answer.json and .md.
#
#   scripts/gpu-check.sh [OUT [gpu_check.py options]]     (default OUT: gpu-check)
#
# Runs from a clone with the package installed, or with PYTHONPATH=src; pytest and
# pytest-xdist are needed for the tests. Exit 0 when the tests pass and every stage measured.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu-check}
[ $# -gt 0 ] && shift  # the rest goes to benchmarks/gpu_check.py
mkdir -p "$out"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
start=$(date +%s)
python -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "gpu-check: no CUDA GPU here (torch.cuda.is_available() is False)")' || exit 2
workers=${GPU_CHECK_TEST_WORKERS:-4}
timeout "${GPU_CHECK_TEST_TIMEOUT_S:-240}" python -m pytest -q -p no:randomly -p no:cacheprovider \
  -m gpu -n "$workers" tests/test_gpu.py 2>&1 | tee "$out/gpu-tests.log"
tests=${PIPESTATUS[0]}
summary=$(grep -E '(passed|failed|error)' "$out/gpu-tests.log" | tail -1 | tr -d '=' | xargs)
python benchmarks/gpu_check.py --out "$out" --tests "${summary:-no summary (exit $tests)}" "$@" \
  2>&1 | tee "$out/gpu-check.log"
bench=${PIPESTATUS[0]}
# the ImageNet protocol's wall time, predicted from the rates just measured (+ probes and kNN)
python benchmarks/time_to_answer.py --from-check "$out/gpu-check.json" --stages probes,knn \
  --out "$out/time_to_answer.json" 2>&1 | tee "$out/time_to_answer.log"
echo "gpu-check: $(( $(date +%s) - start )) s; tests exit $tests, benchmarks exit $bench;" \
  "$out/gpu-check.json, $out/gpu-check.md"
[ "$tests" -eq 0 ] && [ "$bench" -eq 0 ]
