#!/usr/bin/env bash
# The prepared GPU run: on a machine with an NVIDIA GPU and CUDA, in one call.
#
#   bash benches/gpu.sh            # writes benches/report/gpu/report.json and report.md
#
# Stages, in order; the first failure stops the run with status 1 (the report still records
# what ran and where it failed):
#   1. build, once, with every core: the CUDA tests, the kernel bench and the GPT trainer;
#   2. the fused kernels against a CPU reference, on CUDA;
#   3. RTP on Autodiff<Rtp<Cuda>> against single-device Autodiff<NdArray>, N = 2 and 3;
#   4. the kernel bench: fused against composed, config A, d_model 1024 and d_model 4096;
#   5. the GPT trainer, configs A and B, RTP against DDP, N ranks on GPU 0, in absolute times,
#      with each rank's ledger peak, the hidden share of its transfers and the GPU's peak
#      memory (nvidia-smi, sampled every 200 ms: the one process of every rank);
#   6. the NCCL transport at N = 1 under mpirun (NCCL refuses two ranks on one GPU): start-up,
#      the unique id over MPI, the communicator, three steps. Only where Open MPI (mpicc,
#      mpirun) and libnccl are installed; elsewhere the stage is recorded as skipped.
# Needs: cargo, nvidia-smi, python3 (writes the report). GPU_COMMIT names the commit when the
# tree has no .git. GPU_REPORT_DIR overrides the output folder. On the lent device machine:
#   GPU_REPORT_DIR=$OUT/gpu GPU_COMMIT=<commit> bash benches/gpu.sh
# RTP_BENCH_ONLY (set, empty) skips the bench's CPU-only NdArray sections.
set -uo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
OUT_DIR=${GPU_REPORT_DIR:-benches/report/gpu}
LOGS="$OUT_DIR/logs"
rm -rf "$LOGS"
mkdir -p "$LOGS"
STAGES="$LOGS/stages.tsv"
: >"$STAGES"
# No sampler outlives the run, whichever stage ends it.
trap 'kill $(jobs -p) 2>/dev/null' EXIT

command -v python3 >/dev/null || { echo "python3 is needed to write the report"; exit 1; }
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >"$LOGS/gpus.txt" 2>&1; then
  echo "no NVIDIA GPU visible (nvidia-smi); nothing ran"; exit 1
fi
nvidia-smi >"$LOGS/nvidia-smi.txt" 2>&1 || true
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$LOGS/gpu.csv" 2>&1 || true
(command -v nvcc >/dev/null && nvcc --version || echo "nvcc: not found") >"$LOGS/nvcc.txt" 2>&1
COMMIT=${GPU_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
echo "$COMMIT" >"$LOGS/commit.txt"
rustc --version >"$LOGS/rustc.txt" 2>&1 || true
nproc >"$LOGS/cores.txt"

write_report() { python3 benches/gpu_report.py "$OUT_DIR"; }

# stage NAME LOG COMMAND...: runs COMMAND with its output in LOG, records status and seconds.
stage() {
  local name=$1 log=$2; shift 2
  echo; echo "== $name"
  local t0=$SECONDS
  "$@" >"$LOGS/$log" 2>&1
  local rc=$?
  printf '%s\t%s\t%s\t%s\n' "$name" "$log" "$rc" "$((SECONDS - t0))" >>"$STAGES"
  grep -E "^(test result|test .* (ok|FAILED)$)|panicked|^error" "$LOGS/$log" | tail -20
  if [ "$rc" -ne 0 ]; then
    echo "FAILED: $name (exit $rc); last lines of $LOGS/$log:"; tail -30 "$LOGS/$log"
    write_report; exit 1
  fi
}

# One feature set and one package set for every cargo call, so Burn is built once.
PKGS=(-p burn-rtp-kernels -p burn-rtp -p burn-rtp-examples)
FEATURES=burn-rtp-kernels/cuda,burn-rtp/cuda,burn-rtp-examples/cuda
JOBS=$(nproc)

stage "build" build.log bash -c "
  cargo test --release -j $JOBS ${PKGS[*]} --features $FEATURES --no-run --test steps --test cuda &&
  cargo build --release -j $JOBS ${PKGS[*]} --features $FEATURES --example gpt &&
  cargo bench -j $JOBS ${PKGS[*]} --features $FEATURES --bench steps --no-run"

stage "kernels on CUDA against a CPU reference" kernels.log \
  cargo test --release ${PKGS[@]} --features "$FEATURES" --test steps

stage 'RTP on `Rtp<Cuda>` against single-device NdArray, N = 2 and 3' equivalence.log \
  cargo test --release ${PKGS[@]} --features "$FEATURES" --test cuda

stage "kernel bench: fused against composed" bench.log \
  env RTP_BENCH_QUICK=1 RTP_BENCH_ONLY= cargo bench ${PKGS[@]} --features "$FEATURES" --bench steps

GPT=${CARGO_TARGET_DIR:-target}/release/examples/gpt
[ -x "$GPT" ] || { echo "the gpt example was not built"; write_report; exit 1; }

# gpt_run NAME ARGS...: one trainer run with its JSON report and the GPU's sampled memory.
gpt_run() {
  local name=$1; shift
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$LOGS/gpt-$name.mem" 2>/dev/null &
  local sampler=$!
  stage "gpt $name" "gpt-$name.log" "$GPT" --backend cuda --steps 20 --sample-bytes 0 \
    --report "$LOGS/gpt-$name.json" "$@"
  kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null
}
A=(--seq 64 --d-model 256 --layers 4 --heads 4)
B=(--seq 16 --d-model 768 --layers 6 --heads 12)
gpt_run a-2-rtp-fused --strategy rtp --kernels fused --ranks 2 --batch 16 "${A[@]}"
gpt_run a-2-rtp-generic --strategy rtp --kernels generic --ranks 2 --batch 16 "${A[@]}"
gpt_run a-2-ddp --strategy ddp --ranks 2 --batch 16 "${A[@]}"
gpt_run b-2-rtp --strategy rtp --ranks 2 --batch 4 "${B[@]}"
gpt_run b-2-ddp --strategy ddp --ranks 2 --batch 4 "${B[@]}"
gpt_run b-4-rtp --strategy rtp --ranks 4 --batch 8 "${B[@]}"
gpt_run b-4-ddp --strategy ddp --ranks 4 --batch 8 "${B[@]}"

# Last, so that it costs the stages above nothing: a second build (burn-rtp with MPI and
# NCCL; Burn itself is not rebuilt) and one run.
if command -v mpicc >/dev/null && command -v mpirun >/dev/null && ldconfig -p 2>/dev/null | grep -q libnccl; then
  stage "NCCL transport at N = 1 under mpirun" nccl.log bash -c "
    cargo build --release -j $JOBS ${PKGS[*]} --features $FEATURES,burn-rtp-examples/nccl --example gpt &&
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --allow-run-as-root -np 1 \
      $GPT --backend cuda --transport nccl --strategy rtp --steps 3 --sample-bytes 0 ${A[*]} --batch 4"
else
  echo "skipped: needs mpicc, mpirun and libnccl (Open MPI and NCCL are not installed here)" >"$LOGS/nccl.log"
  printf '%s\t%s\t%s\t%s\n' "NCCL transport at N = 1 (skipped: no Open MPI or libnccl)" nccl.log 0 0 >>"$STAGES"
fi

write_report
echo; cat "$OUT_DIR/report.md"
