#!/usr/bin/env python3
"""Where one rank's CPU time goes in a training job: ours or PyTorch's, sampled by perf.

Runs `mpirun -np N` jobs of config A or B with rank 0 under `perf record -e cpu-clock` (a
software clock: it works where hardware counters are not exposed), and prints rank 0's CPU
time per training step grouped into what the CPU was doing, as a markdown table. Samples
cover the whole process, so it runs the job twice, with the timed steps and with one, and
divides the difference by the steps between: start-up (Python importing torch, building the
model) and the warm-up step drop out.

  python3 benches/profile/cpu_profile.py --runner ours-ddp --config a --ranks 4 \
      --out benches/report/profile/ours-ddp-a-n4.json
  python3 benches/profile/cpu_profile.py --runner pytorch-ddp --python .venv/bin/python ...

`readme-figures` turns the JSON files under benches/report/profile/ into the table in
docs/performance.md.

Needs perf (Debian's linux-perf), Open MPI, and a release build of scaling-report with
`--features mpi` (for ours) or the PyTorch peer's Python (benches/peers/pytorch).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import OrderedDict

CONFIGS = {
    "a": {"model": {"vocab": 256, "seq": 64, "d_model": 256, "layers": 4, "heads": 4,
                    "tie_embeddings": False}, "batch_per_rank": 8},
    "b": {"model": {"vocab": 256, "seq": 16, "d_model": 768, "layers": 6, "heads": 12,
                    "tie_embeddings": False}, "batch_per_rank": 2},
}

# What a sampled symbol was doing, first match wins. The patterns name the symbols perf
# shows for burn-ndarray (matrixmultiply, ndarray, libm), our kernels (burn_rtp_kernels),
# PyTorch's CPU build (oneDNN/MKL GEMMs, ATen's vectorised kernels) and Open MPI / gloo.
CATEGORIES = OrderedDict([
    ("matrix multiply (GEMM and its packing)",
     r"sgemm|gemm|matrixmultiply|packed_lhs|pack_lhs|pack_avx|mkl_blas|dnnl|brgemm|jit_avx|"
     r"mkldnn|xbyak|libgomp|blas_thread|gomp_"),
    ("transcendental math (exp, tanh, erf, pow)",
     r"exp|tanh|erf|pow|log1p|__log|sqrt|libm"),
    ("element-wise ops and reductions",
     r"ndarray::|burn_ndarray|mapv|Zip|zip_mut|to_vec_mapped|at::native|at::vec|"
     r"vectorized|cpu_kernel|binary_op|reduce|softmax|layer_norm|gelu|adam|foreach"),
    ("memory: copies, fills, allocation, page faults",
     r"memmove|memcpy|memset|malloc|_int_free|_int_malloc|cfree|free$|page_fault|clear_page|"
     r"do_anonymous|mmap|munmap|brk|alloc_pages|memcg|rmqueue|__pte|handle_mm|zap_|"
     r"TensorData::full|copy_to_iter|copy_from_iter|folio"),
    ("communication (MPI, gloo, sockets, yields)",
     r"mpi|ompi|opal|pmix|mca_|gloo|tcp|sock|sched_yield|futex|finish_task_switch|"
     r"schedule|epoll|poll|__switch_to|syscall|entry_SYSCALL|do_syscall|raw_spin|"
     r"skb|_sys_"),
    ("framework: autodiff, dispatch, interpreter",
     r"burn_autodiff|burn_rtp::|burn_tensor|burn_backend|torch::autograd|c10::|"
     r"at::Tensor|TensorImpl|dispatch|Dispatcher|_PyEval|Py|python"),
])


def classify(symbol, dso):
    text = f"{dso} {symbol}"
    for name, pattern in CATEGORIES.items():
        if re.search(pattern, text, re.IGNORECASE):
            return name
    return "other"


def run(args, steps):
    job_dir = tempfile.mkdtemp(prefix="cpu-profile-")
    perf_data = os.path.join(job_dir, "rank0.perf")
    cfg = CONFIGS[args.config]
    strategy = args.runner.split("-", 1)[1]
    job = {
        "variant": {"strategy": strategy, "rotation": "out-of-place", "buckets": True},
        "model": cfg["model"], "batch_per_rank": cfg["batch_per_rank"],
        "warmup": 1, "steps": steps, "out": os.path.join(job_dir, "result.json"),
    }
    wrapper = os.path.join(job_dir, "wrap.sh")
    with open(wrapper, "w") as f:
        f.write("#!/bin/bash\n"
                "if [ \"$OMPI_COMM_WORLD_RANK\" = 0 ]; then\n"
                f"  exec perf record -q -e cpu-clock -F {args.frequency} -o {perf_data} -- \"$@\"\n"
                "fi\nexec \"$@\"\n")
    os.chmod(wrapper, 0o755)
    cmd = ["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", str(args.ranks),
           "-x", "MASTER_ADDR=127.0.0.1", "-x", f"MASTER_PORT={args.port}", wrapper]
    if args.runner.startswith("ours"):
        cmd += [args.exe, "worker", "job", json.dumps(job)]
    else:
        script = os.path.join(os.path.dirname(__file__), "..", "peers", "pytorch", "gpt_peer.py")
        cmd += [args.python, script, "--strategy", strategy, "--job", json.dumps(job)]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    with open(job["out"]) as f:
        result = json.load(f)
    report = subprocess.run(
        ["perf", "report", "-i", perf_data, "--no-children", "--sort", "dso,symbol",
         "--stdio", "-F", "period,dso,symbol", "-g", "none"],
        check=True, capture_output=True, text=True).stdout
    return result, report


def parse(report):
    totals = OrderedDict((name, 0) for name in list(CATEGORIES) + ["other"])
    top_other = {}
    for line in report.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        m = re.match(r"\s*(\d+)\s+(\S+)\s+\[.\]\s+(.*?)[\s-]*$", line)
        if not m:
            continue
        period, dso, symbol = int(m.group(1)), m.group(2), m.group(3).strip()
        name = classify(symbol, dso)
        totals[name] += period
        if name == "other":
            top_other[f"{dso} {symbol}"] = top_other.get(f"{dso} {symbol}", 0) + period
    return totals, top_other


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runner", required=True,
                   choices=["ours-ddp", "ours-fsdp", "ours-rtp", "pytorch-ddp", "pytorch-fsdp"])
    p.add_argument("--config", choices=["a", "b"], default="a")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--steps", type=int, default=20, help="timed steps (at least 2)")
    p.add_argument("--frequency", type=int, default=997)
    p.add_argument("--port", type=int, default=29531)
    p.add_argument("--exe", default=os.path.expanduser(
        "~/.cache/burn-rtp-target/release/scaling-report"))
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--out", help="also write the result as JSON to this file")
    p.add_argument("--label", help="when it was measured, shown beside the runner in tables")
    args = p.parse_args()
    if args.steps < 2:
        p.error("--steps must be at least 2")
    result, report = run(args, args.steps)
    totals, top_other = parse(report)
    _, start_report = run(args, 1)
    start, _ = parse(start_report)
    # perf's period of a cpu-clock sample is nanoseconds of CPU time.
    per_step = OrderedDict(
        (k, max(0, v - start[k]) / 1e6 / (args.steps - 1)) for k, v in totals.items())
    cpu_ms_per_step = sum(per_step.values()) or 1e-9
    steps = sorted(result["step_s"])
    median_ms = steps[len(steps) // 2] * 1e3
    out = {
        "runner": args.runner, "config": args.config, "ranks": args.ranks,
        "steps": args.steps, "median_step_ms": median_ms,
        "cpu_ms_per_step": cpu_ms_per_step,
        "progress": result.get("progress", [""])[0],
        "shares": {k: v / cpu_ms_per_step for k, v in per_step.items()},
    }
    if args.label:
        out["label"] = args.label
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")
    print(f"{args.runner}, config {args.config.upper()}, N={args.ranks}: median step "
          f"{median_ms:.0f} ms; rank 0 ran {cpu_ms_per_step:.0f} ms of CPU per step:\n")
    print("| what the CPU did | share of rank 0's CPU time | CPU ms per step |")
    print("|---|---|---|")
    for name, v in per_step.items():
        print(f"| {name} | {v / cpu_ms_per_step:.1%} | {v:.0f} |")
    if top_other:
        worst = sorted(top_other.items(), key=lambda kv: -kv[1])[:5]
        print("\nlargest unclassified symbols (with start-up): " +
              ", ".join(f"{k} ({v / 1e6 / args.steps:.1f} ms/step)" for k, v in worst),
              file=sys.stderr)


if __name__ == "__main__":
    main()
