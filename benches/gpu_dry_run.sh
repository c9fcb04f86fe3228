#!/usr/bin/env bash
# Runs benches/gpu.sh as it runs on the GPU machine (prebuilt programs, no cargo used), with
# stubs in place of the GPU and the programs: a stub nvidia-smi, and packed stub programs
# that print what the real ones print (the gpt stub writes TRAINER_REPORT, a real CPU trainer
# report, where it is asked to). Checks the unpacking, the stages' order, the NCCL stage's
# detection, the report and the exit status, on a passing run and on one whose kernel tests
# fail. CI runs it; it needs python3 and xz.
#
#   bash benches/gpu_dry_run.sh TRAINER_REPORT WORK_DIR
set -euo pipefail
report=$(realpath "$1")
work=$(realpath -m "$2")
cd "$(dirname "$0")/.."
rm -rf "$work"
mkdir -p "$work/path" "$work/stubs" "$work/py/nvidia/nccl/lib"

cat >"$work/path/nvidia-smi" <<'EOF'
#!/bin/bash
case "$*" in
  -L) echo "GPU 0: Stub GPU";;
  *memory.used*) while true; do echo 1234; sleep 0.2; done;;
  *query-gpu=name*) echo "Stub GPU, 580.00, 81559 MiB";;
  *) echo "| NVIDIA-SMI 580.00   Driver Version: 580.00   CUDA Version: 13.0 |";;
esac
EOF
for t in kernels-steps rtp-cuda; do
  printf '#!/bin/bash\necho "cwd $(pwd)"\necho "test %s_stub ... ok"\necho "test result: ok. 1 passed; 0 failed"\n' "$t" >"$work/stubs/$t"
done
printf '#!/bin/bash\necho "args $*"\necho "| cuda | A d1024 | forward | 1.00 | 2.00 | 0.50 | 1 / 1 | 2 / 2 |"\n' >"$work/stubs/bench-steps"
printf '#!/bin/bash\nwhile [ $# -gt 0 ]; do [ "$1" = --report ] && cp %q "$2"; shift; done\n' "$report" >"$work/stubs/gpt"
printf '#!/bin/bash\necho "gpt-nccl $*"\n' >"$work/stubs/gpt-nccl"
# pip's nvidia-nccl, as the GPU machine's PyTorch brings it.
touch "$work/py/nvidia/nccl/__init__.py" "$work/py/nvidia/nccl/lib/libnccl.so.2"
chmod +x "$work/path/nvidia-smi" "$work/stubs"/*

# pack DIR: the stubs as `--prebuild` leaves its programs.
pack() {
  mkdir -p "$1"
  for f in "$work/stubs"/*; do xz -c "$f" >"$1/$(basename "$f").xz"; done
  printf 'commit stub\nrustc rustc (stub)\nbuilt by the dry run\n' >"$1/manifest.txt"
}
pack "$work/pass"
run() { PATH="$work/path:$PATH" PYTHONPATH="$work/py" TMPDIR="$work" GPU_PREBUILT="$1" GPU_REPORT_DIR="$2" \
  bash benches/gpu.sh >"$2.log" 2>&1; }

run "$work/pass" "$work/out-pass" || { tail -30 "$work/out-pass.log"; exit 1; }
printf '#!/bin/bash\necho "test cuda::stub ... FAILED"\necho "test result: FAILED. 0 passed; 1 failed"\nexit 101\n' >"$work/stubs/kernels-steps"
pack "$work/fail"
if run "$work/fail" "$work/out-fail"; then
  echo "gpu.sh exited 0 on failing kernel tests"; exit 1
fi

python3 - "$work" <<'PY'
import json, shutil, sys
work = sys.argv[1]
ok = json.load(open(f"{work}/out-pass/report.json"))
names = [s["name"] for s in ok["stages"]]
assert ok["passed"] and len(names) == 12, names
nccl_stage = "NCCL transport at N = 1 " + ("under mpirun" if shutil.which("mpirun") else "(skipped: no mpirun)")
assert names[0].startswith("unpack") and names[-1] == nccl_stage, names
assert [r["name"] for r in ok["gpt"]] == sorted(["a-2-rtp-fused", "a-2-rtp-generic", "a-2-ddp",
                                                  "b-2-rtp", "b-2-ddp", "b-4-rtp", "b-4-ddp"]), ok["gpt"]
assert ok["gpt"][0]["gpu_memory_used_peak_mib"] == 1234, ok["gpt"][0]
assert ok["provenance"]["commit"] == "stub" and "prebuilt" in ok["provenance"]["programs"]
nccl = open(f"{work}/out-pass/logs/nccl.log").read()
assert not shutil.which("mpirun") or "--transport nccl" in nccl, nccl
bad = json.load(open(f"{work}/out-fail/report.json"))
assert not bad["passed"] and [s["exit"] for s in bad["stages"]] == [0, 101], bad["stages"]
assert bad["kernel_tests"]["tests"] == [{"name": "cuda::stub", "outcome": "FAILED"}]
print(f"gpu.sh dry run: {len(names)} stages passed on stubs (last: {names[-1]}); "
      "a failing kernel test stops it with status 1 after 2 stages")
PY
