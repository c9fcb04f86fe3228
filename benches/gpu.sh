#!/usr/bin/env bash
# The prepared GPU run: on a machine with an NVIDIA GPU and CUDA, in one call.
#
#   bash benches/gpu.sh --prebuild [DIR]   # where cargo is: builds the programs into DIR
#   bash benches/gpu.sh                    # on the GPU machine: runs them, writes the report
#
# The lent device machine has no Rust toolchain and cannot fetch crates, so the programs are
# built here first (`--prebuild`, default DIR .gpu-bin, git-ignored): stripped and packed
# with xz, with a manifest of the commit and rustc that built them. DIR travels with the
# working tree (the device tool's `carry`), and the run unpacks it (python3's lzma). Where
# cargo is and GPU_PREBUILT is not set, the run builds instead, with every core. CUDA's
# libraries load at run time; the bindings are CUDA 13.0's (CUDARC_CUDA_VERSION, the device
# machine's driver and nvcc), since nvcc is not here to say.
#
# Stages, in order; the first failure stops the run with status 1 (the report still records
# what ran and where it failed):
#   1. build (or unpack the prebuilt programs): the CUDA tests, the kernel bench, the trainer;
#   2. the fused kernels against a CPU reference, on CUDA;
#   3. RTP on Autodiff<Rtp<Cuda>> against single-device Autodiff<NdArray>, N = 2 and 3;
#   4. the kernel bench: fused against composed, config A, d_model 1024 and d_model 4096;
#   5. the GPT trainer, configs A and B, RTP against DDP, N ranks on GPU 0, in absolute times,
#      with each rank's ledger peak, the hidden share of its transfers and the GPU's peak
#      memory (nvidia-smi, sampled every 200 ms: the one process of every rank);
#   6. the NCCL transport at N = 1 under mpirun (NCCL refuses two ranks on one GPU): start-up,
#      the unique id over MPI, the communicator, three steps. Only where mpirun, Open MPI's
#      libmpi and libnccl are found (pip's nvidia-nccl counts); else recorded as skipped.
# Needs: nvidia-smi, python3 (unpacks, writes the report); cargo only to build. GPU_COMMIT
# names the commit when the tree has no .git. GPU_REPORT_DIR overrides the output folder. On
# the lent device machine, with `.gpu-bin` carried (8 files come back from $OUT: the report's
# two, and the logs as one archive):
#   GPU_REPORT_DIR=/tmp/gpu bash benches/gpu.sh; rc=$?; cp /tmp/gpu/report.* $OUT/;
#   tar -C /tmp/gpu -cJf $OUT/logs.tar.xz logs; exit $rc
# RTP_BENCH_ONLY (set, empty) skips the bench's CPU-only NdArray sections.
set -uo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
# One feature set and one package set for every cargo call, so Burn is built once.
PKGS=(-p burn-rtp-kernels -p burn-rtp -p burn-rtp-gpt)
FEATURES=burn-rtp-kernels/cuda,burn-rtp/cuda,burn-rtp-gpt/cuda
JOBS=$(nproc)
export CUDARC_CUDA_VERSION=${CUDARC_CUDA_VERSION:-13000}

# prebuild DIR: builds every program the run needs, then strips and packs each into DIR.
prebuild() {
  local dir=$1 tmp
  tmp=$(mktemp -d)
  for tool in cargo python3 strip xz; do
    command -v $tool >/dev/null || { echo "--prebuild needs $tool"; exit 1; }
  done
  local json=(--message-format=json-render-diagnostics)
  # pick KIND NAME PACKAGE_DIR < cargo's JSON: the executable of one target.
  pick() {
    python3 -c '
import json, os, sys
kind, name, pkg = sys.argv[1:4]
for line in sys.stdin:
    m = json.loads(line)
    t = m.get("target", {})
    if (m.get("reason") == "compiler-artifact" and m.get("executable") and t.get("name") == name
            and kind in t.get("kind", []) and os.path.basename(os.path.dirname(m["manifest_path"])) == pkg):
        print(m["executable"])' "$@"
  }
  # pack NAME PATH: a stripped, packed copy of PATH as DIR/NAME.xz.
  pack() {
    [ -x "$2" ] || { echo "--prebuild: no executable for $1"; exit 1; }
    strip -o "$tmp/$1" "$2" && xz -T0 -6 -c "$tmp/$1" >"$dir/$1.xz" || exit 1
    echo "$1: $(($(stat -c %s "$tmp/$1") >> 20)) MiB, packed $(($(stat -c %s "$dir/$1.xz") >> 20)) MiB"
  }
  rm -rf "$dir" && mkdir -p "$dir"
  cargo test --release "${PKGS[@]}" --features "$FEATURES" --no-run --test steps --test cuda "${json[@]}" >"$tmp/tests.json" || exit 1
  pack kernels-steps "$(pick test steps burn-rtp-kernels <"$tmp/tests.json")"
  pack rtp-cuda "$(pick test cuda burn-rtp <"$tmp/tests.json")"
  cargo bench "${PKGS[@]}" --features "$FEATURES" --bench steps --no-run "${json[@]}" >"$tmp/bench.json" || exit 1
  pack bench-steps "$(pick bench steps burn-rtp-kernels <"$tmp/bench.json")"
  cargo build --release "${PKGS[@]}" --features "$FEATURES" --example gpt "${json[@]}" >"$tmp/gpt.json" || exit 1
  pack gpt "$(pick example gpt examples <"$tmp/gpt.json")"
  # The NCCL trainer links Open MPI's libmpi: built only where Open MPI's headers are.
  if command -v mpicc >/dev/null; then
    cargo build --release "${PKGS[@]}" --features "$FEATURES,burn-rtp-gpt/nccl" --example gpt "${json[@]}" >"$tmp/gpt-nccl.json" || exit 1
    pack gpt-nccl "$(pick example gpt examples <"$tmp/gpt-nccl.json")"
  fi
  local commit
  commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
  [ -z "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] || commit="$commit (with uncommitted changes)"
  {
    echo "commit $commit"
    echo "rustc $(rustc --version)"
    echo "built $(date -u +%Y-%m-%dT%H:%MZ) on $(uname -m), glibc $(ldd --version | head -1 | awk '{print $NF}'), CUDA bindings $CUDARC_CUDA_VERSION"
  } >"$dir/manifest.txt"
  rm -rf "$tmp"
  cat "$dir/manifest.txt"
  echo "$dir: $(du -sm "$dir" | cut -f1) MiB; carry it to the GPU machine and run \`bash benches/gpu.sh\` there"
}

if [ "${1:-}" = "--prebuild" ]; then
  prebuild "${2:-.gpu-bin}"
  exit 0
fi

# Prebuilt programs where asked for (GPU_PREBUILT) or where cargo is not.
PREBUILT=${GPU_PREBUILT:-}
if [ -z "$PREBUILT" ] && ! command -v cargo >/dev/null; then
  PREBUILT=.gpu-bin
fi
if [ -n "$PREBUILT" ] && [ ! -f "$PREBUILT/manifest.txt" ]; then
  echo "no cargo here and no programs in $PREBUILT: run \`bash benches/gpu.sh --prebuild\` where cargo is, and carry $PREBUILT"
  exit 1
fi
BIN=${TMPDIR:-/tmp}/rtp-gpu-bin

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
nproc >"$LOGS/cores.txt"
if [ -n "$PREBUILT" ]; then
  # The programs' provenance is the manifest's: the commit and rustc that built them.
  sed -n 's/^commit //p' "$PREBUILT/manifest.txt" >"$LOGS/commit.txt"
  sed -n 's/^rustc //p' "$PREBUILT/manifest.txt" >"$LOGS/rustc.txt"
  echo "prebuilt by \`benches/gpu.sh --prebuild\` ($(sed -n 's/^built //p' "$PREBUILT/manifest.txt"))" >"$LOGS/built.txt"
else
  echo "${GPU_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}" >"$LOGS/commit.txt"
  rustc --version >"$LOGS/rustc.txt" 2>&1 || true
  echo "built on this machine by cargo" >"$LOGS/built.txt"
fi

# cudarc loads libcuda and libnvrtc by name at run time. Where the loader does not know
# NVRTC, name CUDA's folder (or pip's nvidia-cuda-nvrtc, which PyTorch brings).
if ! ldconfig -p 2>/dev/null | grep -q libnvrtc; then
  for d in /usr/local/cuda/lib64 "$(python3 -c 'import nvidia.cuda_nvrtc, os; print(os.path.join(list(nvidia.cuda_nvrtc.__path__)[0], "lib"))' 2>/dev/null)"; do
    if [ -n "$d" ] && ls "$d"/libnvrtc.so* >/dev/null 2>&1; then
      export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      break
    fi
  done
fi
{ ldconfig -p 2>/dev/null | grep -E "libcuda\.|libnvrtc|libnccl|libmpi\."; echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"; } >"$LOGS/libs.txt"

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

if [ -n "$PREBUILT" ]; then
  stage "unpack the programs built by --prebuild" unpack.log python3 -c '
import lzma, os, shutil, sys
src, dst = sys.argv[1:3]
os.makedirs(dst, exist_ok=True)
for name in sorted(os.listdir(src)):
    if name.endswith(".xz"):
        out = os.path.join(dst, name[:-3])
        with lzma.open(os.path.join(src, name)) as f, open(out, "wb") as g:
            shutil.copyfileobj(f, g)
        os.chmod(out, 0o755)
        print(out, os.path.getsize(out) >> 20, "MiB")
' "$PREBUILT" "$BIN"
  KERNELS=(bash -c "cd burn-rtp-kernels && exec $BIN/kernels-steps")
  EQUIVALENCE=(bash -c "cd burn-rtp && exec $BIN/rtp-cuda")
  BENCH=(bash -c "cd burn-rtp-kernels && exec $BIN/bench-steps --bench")
  GPT=$BIN/gpt
  GPT_NCCL=$BIN/gpt-nccl
else
  stage "build" build.log bash -c "
    cargo test --release -j $JOBS ${PKGS[*]} --features $FEATURES --no-run --test steps --test cuda &&
    cargo build --release -j $JOBS ${PKGS[*]} --features $FEATURES --example gpt &&
    cargo bench -j $JOBS ${PKGS[*]} --features $FEATURES --bench steps --no-run"
  KERNELS=(cargo test --release "${PKGS[@]}" --features "$FEATURES" --test steps)
  EQUIVALENCE=(cargo test --release "${PKGS[@]}" --features "$FEATURES" --test cuda)
  BENCH=(cargo bench "${PKGS[@]}" --features "$FEATURES" --bench steps)
  GPT=${CARGO_TARGET_DIR:-target}/release/examples/gpt
  GPT_NCCL=
fi

stage "kernels on CUDA against a CPU reference" kernels.log "${KERNELS[@]}"

stage 'RTP on `Rtp<Cuda>` against single-device NdArray, N = 2 and 3' equivalence.log "${EQUIVALENCE[@]}"

stage "kernel bench: fused against composed" bench.log \
  env RTP_BENCH_QUICK=1 RTP_BENCH_ONLY= "${BENCH[@]}"

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

# Last, so that it costs the stages above nothing. cudarc looks for `libnccl.so` (or
# `.so.<CUDA major>`), while NCCL installs `libnccl.so.2` (pip's nvidia-nccl, or the system's
# libnccl2): a link under the name cudarc asks for is put beside the programs. The trainer
# built with `nccl` links Open MPI's libmpi.
NCCL_SO=$(ldconfig -p 2>/dev/null | awk '/libnccl\.so/ {print $NF; exit}')
[ -n "$NCCL_SO" ] || NCCL_SO=$(python3 -c 'import nvidia.nccl, glob, os; print(sorted(glob.glob(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so*")))[0])' 2>/dev/null)
if [ -n "$NCCL_SO" ]; then
  mkdir -p "$BIN/lib" && ln -sf "$NCCL_SO" "$BIN/lib/libnccl.so"
  export LD_LIBRARY_PATH="$BIN/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
nccl_missing() {
  command -v mpirun >/dev/null || { echo "no mpirun"; return; }
  [ -n "$NCCL_SO" ] || { echo "no libnccl"; return; }
  if [ -n "$PREBUILT" ]; then
    [ -f "$PREBUILT/gpt-nccl.xz" ] || { echo "--prebuild found no Open MPI to build it with"; return; }
    ldd "$GPT_NCCL" | grep -q "not found" && { echo "$(ldd "$GPT_NCCL" | grep "not found" | awk '{print $1}' | xargs) not found"; return; }
  else
    command -v mpicc >/dev/null || { echo "no Open MPI headers (mpicc) to build with"; return; }
  fi
}
MISSING=$(nccl_missing)
if [ -z "$MISSING" ]; then
  BUILD_NCCL=
  if [ -z "$PREBUILT" ]; then
    BUILD_NCCL="cargo build --release -j $JOBS ${PKGS[*]} --features $FEATURES,burn-rtp-gpt/nccl --example gpt &&"
    GPT_NCCL=$GPT
  fi
  stage "NCCL transport at N = 1 under mpirun" nccl.log bash -c "$BUILD_NCCL
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --allow-run-as-root -np 1 \
      $GPT_NCCL --backend cuda --transport nccl --strategy rtp --steps 3 --sample-bytes 0 ${A[*]} --batch 4"
else
  echo "skipped: $MISSING" >"$LOGS/nccl.log"
  printf '%s\t%s\t%s\t%s\n' "NCCL transport at N = 1 (skipped: $MISSING)" nccl.log 0 0 >>"$STAGES"
fi

write_report
echo; cat "$OUT_DIR/report.md"
