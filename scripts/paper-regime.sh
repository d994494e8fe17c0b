#!/usr/bin/env bash
# E2MC in the paper's regime on one GPU (issue 43): VICReg with its own 8192-8192-8192 projector
# at batch 2048, a ResNet-18 at 32 px, trained to a plateau on Fashion-MNIST; then E2MC against
# plain continued training in the protocol of docs/results.md (the random-init floor, 3 training
# seeds x 3 label seeds, paired and pooled tests, MNIST transfer), through the study harness
# benchmarks/reproduce_fashion_mnist.py. Everything is cached in OUT: run the same command again
# in the next GPU window and it goes on where it stopped (a killed run resumes from its last
# checkpoint). The settings of E2MC for the confirmed comparison come from `e2mc search` on a
# validation split (docs/validation.md); the first pass uses the preset's.
#
#   scripts/paper-regime.sh PATH/TO/fashion-mnist [PATH/TO/mnist]
#
# Environment: OUT (default benchmarks/out/paper-regime), DEVICE (cuda), BATCH (2048),
# BASE_EPOCHS (100), WORKERS (the cores less one), STAGES (bases,continue,eval,report),
# PAPER_REGIME_DRY=1 prints the command instead of running it.
set -euo pipefail
cd "$(dirname "$0")/.."
data=${1:?usage: scripts/paper-regime.sh PATH/TO/fashion-mnist [PATH/TO/mnist]}
transfer=${2:-}
workers=${WORKERS:-$(( $(python -c 'from e2mc.processes import available_cores as c; print(c())') - 1 ))}
projector="method.params.projector=8192-8192-8192"
cmd=(python benchmarks/reproduce_fashion_mnist.py --data "$data"
     --out "${OUT:-benchmarks/out/paper-regime}" --methods vicreg --device "${DEVICE:-cuda}"
     --backbone resnet18 --image-size 32 --batch-size "${BATCH:-2048}"
     --base-epochs "${BASE_EPOCHS:-100}" --num-workers "$workers"
     --base-set "$projector" --continue-set "$projector"
     --stages "${STAGES:-bases,continue,eval,report}")
if [ -n "$transfer" ]; then cmd+=(--transfer-data "$transfer"); fi
if [ "${PAPER_REGIME_DRY:-0}" = 1 ]; then printf '%q ' "${cmd[@]}"; echo; exit 0; fi
exec "${cmd[@]}"
