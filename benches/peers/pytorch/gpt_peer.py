#!/usr/bin/env python3
"""PyTorch peer for the burn-rtp scaling report: times DDP or FSDP2 on the report's GPT.

Launched once per rank (by `mpirun`, or `torchrun`):

    python gpt_peer.py --strategy {single,ddp,fsdp} --job JOB_JSON [--threads T]

`single` trains the model as it is, with no wrapper (the single-device reference); it runs
at any world size, each rank on its own, and is meant for one process.

JOB_JSON carries `model`, `batch_per_rank`, `warmup`, `steps` and `out`; every other key is
ignored. Rank 0 writes the result JSON to `out`.

Exit codes: 0 success, 1 any error, 2 a job this harness does not run (tied embeddings, bad
JSON), 3 FSDP2 unavailable in this PyTorch build.
"""

import argparse
import json
import os
import sys
import time
import traceback


def log(msg):
    print(f"gpt_peer: {msg}", file=sys.stderr, flush=True)


def fail(code, msg):
    log(msg)
    sys.stderr.flush()
    sys.stdout.flush()
    # `os._exit`: no interpreter teardown that could wait on a peer that is already gone.
    os._exit(code)


def env_int(names, default):
    for name in names:
        value = os.environ.get(name)
        if value is not None and value != "":
            return int(value)
    return default


def vm_hwm_bytes():
    """Peak resident set size of this process (`VmHWM`), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("VmHWM not found in /proc/self/status")


def minor_faults():
    """Minor page faults of this process so far (`minflt` of /proc/self/stat)."""
    with open("/proc/self/stat") as f:
        stat = f.read()
    return int(stat[stat.rindex(")") + 1:].split()[7])


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--strategy", required=True, choices=["single", "ddp", "fsdp"])
    p.add_argument("--job", required=True, help="job JSON string")
    p.add_argument("--threads", type=int, default=None, help="intra-op threads per rank")
    return p.parse_args()


def parse_job(text):
    try:
        job = json.loads(text)
        m = job["model"]
        model = {
            k: int(m[k]) for k in ("vocab", "seq", "d_model", "layers", "heads")
        }
        model["tie_embeddings"] = bool(m.get("tie_embeddings", False))
        parsed = {
            "model": model,
            "batch_per_rank": int(job["batch_per_rank"]),
            "warmup": int(job["warmup"]),
            "steps": int(job["steps"]),
            "out": str(job["out"]),
        }
    except (ValueError, KeyError, TypeError) as e:
        fail(2, f"bad --job JSON: {e!r}")
    if model["tie_embeddings"]:
        fail(2, "tie_embeddings=true is not supported by the PyTorch peer "
                "(its GPT has separate token-embedding and head weights)")
    if model["d_model"] % model["heads"] != 0:
        fail(2, f"d_model {model['d_model']} is not divisible by heads {model['heads']}")
    if parsed["steps"] < 1 or parsed["warmup"] < 0 or parsed["batch_per_rank"] < 1:
        fail(2, "need steps >= 1, warmup >= 0, batch_per_rank >= 1")
    return parsed


def build_model(torch, nn, cfg):
    vocab, seq, d = cfg["vocab"], cfg["seq"], cfg["d_model"]
    layers, heads = cfg["layers"], cfg["heads"]

    class Gpt(nn.Module):
        """Mirror of the Rust GPT: token + position embeddings, pre-norm causal encoder
        (d_ff = 4d, exact GELU, dropout 0, biased attention projections), final LayerNorm,
        biased head."""

        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(vocab, d)
            self.pos = nn.Embedding(seq, d)
            layer = nn.TransformerEncoderLayer(
                d, heads, dim_feedforward=4 * d, dropout=0.0, activation="gelu",
                batch_first=True, norm_first=True,
            )
            self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab)
            self.register_buffer(
                "causal", nn.Transformer.generate_square_subsequent_mask(seq), persistent=False
            )
            self.register_buffer("positions", torch.arange(seq), persistent=False)

        def forward(self, tokens):
            x = self.tok(tokens) + self.pos(self.positions)
            x = self.encoder(x, mask=self.causal, is_causal=True)
            return self.head(self.norm(x))

    return Gpt()


def main():
    args = parse_args()
    job = parse_job(args.job)
    cfg = job["model"]

    rank = env_int(["OMPI_COMM_WORLD_RANK", "RANK"], 0)
    world = env_int(["OMPI_COMM_WORLD_SIZE", "WORLD_SIZE"], 1)
    threads = args.threads if args.threads is not None else max(1, (os.cpu_count() or 1) // world)
    if threads < 1:
        fail(2, f"--threads must be >= 1, got {threads}")

    import torch

    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)

    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F

    fully_shard = None
    if args.strategy == "fsdp":
        try:
            from torch.distributed.fsdp import fully_shard
            from torch.distributed.device_mesh import init_device_mesh
        except ImportError as e:
            fail(3, f"FSDP2 (torch.distributed.fsdp.fully_shard) is unavailable in torch "
                    f"{torch.__version__}: {e}")

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world)

    baseline_rss = vm_hwm_bytes()
    torch.manual_seed(0)  # same initial weights on every rank
    model = build_model(torch, nn, cfg)
    params = sum(p.numel() for p in model.parameters())

    if args.strategy == "single":
        pass
    elif args.strategy == "ddp":
        model = nn.parallel.DistributedDataParallel(model)  # bucket_cap_mb 25
    else:
        mesh = init_device_mesh("cpu", (world,))
        try:
            for layer in model.encoder.layers:
                fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            fail(3, f"FSDP2 fully_shard failed on CPU/gloo in torch {torch.__version__}: {e!r}")

    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    vocab, seq, batch = cfg["vocab"], cfg["seq"], job["batch_per_rank"]

    step_s = []
    faults_before = minor_faults()
    for step in range(job["warmup"] + job["steps"]):
        if step == job["warmup"]:
            faults_before = minor_faults()
        gen = torch.Generator().manual_seed(1000 * step + rank)
        tokens = torch.randint(0, vocab, (batch, seq), generator=gen)
        targets = torch.randint(0, vocab, (batch, seq), generator=gen)
        dist.barrier()
        t0 = time.perf_counter()
        logits = model(tokens)
        loss = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        dist.barrier()
        elapsed = time.perf_counter() - t0
        if not torch.isfinite(loss.detach()):
            raise RuntimeError(f"non-finite loss {loss.item()} at step {step}")
        if step >= job["warmup"]:
            step_s.append(elapsed)

    faults_per_step = (minor_faults() - faults_before) / max(1, job["steps"])
    peak_rss = vm_hwm_bytes()
    progress = f"torch {torch.__version__}, gloo, {threads} thread(s)"
    mine = {"peak": peak_rss, "baseline": baseline_rss, "progress": progress,
            "faults": faults_per_step}
    gathered = [None] * world
    dist.all_gather_object(gathered, mine)

    if rank == 0:
        result = {
            "params": params,
            "step_s": step_s,
            "ledger_peak_bytes": [],
            "peak_rss_bytes": [g["peak"] for g in gathered],
            "baseline_rss_bytes": [g["baseline"] for g in gathered],
            "overlap": [None] * world,
            "wire_in_waits": [None] * world,
            "progress": [g["progress"] for g in gathered],
            "sent_bytes_per_step": [],
            "rotation_compute_s_per_step": [],
            "minor_faults_per_step": [g["faults"] for g in gathered],
        }
        out = job["out"]
        parent = os.path.dirname(os.path.abspath(out))
        os.makedirs(parent, exist_ok=True)
        tmp = f"{out}.tmp.{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(result, f)
        os.replace(tmp, out)

    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    try:
        main()
    except SystemExit:
        raise
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        fail(1, "failed")
    sys.stdout.flush()
    sys.stderr.flush()
    # The result is written and the group destroyed; skip the interpreter's teardown, where
    # gloo's threads sometimes abort the process ("terminate called without an active
    # exception"), which mpirun would report as a failed job.
    os._exit(0)
