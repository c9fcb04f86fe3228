#!/usr/bin/env bash
# On a machine with an NVIDIA GPU and CUDA: the fused kernels against a CPU reference, RTP on
# Rtp<Cuda> against single-device NdArray (N = 2, 3), the kernel bench (fused against the
# compositions it replaces), and the GPT trainer on config A at N = 2 (RTP fused, RTP generic,
# DDP). Unattended: every stage prints its figures; the first failure stops it with status 1.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L; then
  echo "no NVIDIA GPU visible (nvidia-smi); nothing ran"; exit 1
fi
stage() { echo; echo "== $1"; }

stage "the fused kernels against a CPU reference, on CUDA"
cargo test --release -p burn-rtp-kernels --features cuda --test steps 2>&1 | grep -E "^(test |test result)|panicked"

stage "RTP on Autodiff<Rtp<Cuda>> against single-device Autodiff<NdArray>, N = 2 and 3"
cargo test --release -p burn-rtp --features cuda --test cuda 2>&1 | grep -E "^(test |test result)|panicked"

stage "kernel bench: fused against composed, config A and d_model 1024 (ms per call, ratios)"
cargo bench -p burn-rtp-kernels --features cuda --bench steps 2>/dev/null | grep -E "^(\||Rotation steps|Bytes are)"

stage "GPT, config A (d_model 256, 4 layers, context 64, 8 sequences per rank), N = 2 on GPU 0"
for run in "rtp fused" "rtp generic" "ddp fused"; do
  set -- $run
  cargo run --release --example gpt --features cuda -- --backend cuda --strategy "$1" \
    --kernels "$2" --ranks 2 --steps 30 --batch 16 --seq 64 --d-model 256 --layers 4 \
    --heads 4 2>/dev/null | grep -E "rank\(s\)"
done
