//! The tables: each report's headline figures, with what they mean and their targets.

use super::{fig, Bound, Figure};

/// The in-process scaling report's headline figures (`benches/report/report.json`).
pub const IN_PROCESS: &[Figure] = &[
    fig(
        "rtp_over_ddp_peak_n4",
        "RTP peak / DDP peak per rank, N=4",
        Bound::AtMost(0.30),
    ),
    fig(
        "rtp_over_fsdp_peak_n4",
        "RTP peak / FSDP peak per rank, N=4",
        Bound::AtMost(0.80),
    ),
    fig(
        "memory_scaling_efficiency_n8",
        "memory-scaling efficiency (ideal / measured model state), N=8",
        Bound::AtLeast(0.95),
    ),
    fig(
        "rtp_over_ddp_step_time_n4",
        "RTP / DDP step time, state-dominated model, N=4",
        Bound::AtMost(1.10),
    ),
    fig(
        "capacity_rtp_over_ddp_n4",
        "largest trainable model under a cap, RTP / DDP, N=4",
        Bound::AtLeast(3.5),
    ),
    fig(
        "rtp_over_ddp_step_time_a_n4",
        "RTP / DDP step time, config A, N=4",
        Bound::AtMost(1.05),
    ),
    fig(
        "rtp_over_ddp_step_time_small_n4",
        "RTP / DDP step time, small model, N=4",
        Bound::AtMost(1.05),
    ),
    fig(
        "rtp_over_ddp_step_time_small_n8",
        "RTP / DDP step time, small model, N=8",
        Bound::AtMost(1.10),
    ),
    fig(
        "syncs_per_linear_backward_n4",
        "exchanges per Linear backward, N=4 (one ring pass: N-1 = 3)",
        Bound::AtMost(3.0),
    ),
    fig(
        "planner_max_rel_error_ledger",
        "memory planner: largest relative error of the predicted peak over its grid",
        Bound::AtMost(0.10),
    ),
    fig(
        "overlap_fraction_n4",
        "share of rotation transfer time hidden behind compute, N=4",
        Bound::Reported,
    ),
    fig(
        "activation_checkpoint_peak_ratio_a_n4",
        "RTP peak with / without balanced activation checkpointing, config A, N=4",
        Bound::AtMost(0.60),
    ),
    fig(
        "activation_checkpoint_step_ratio_a_n4",
        "RTP step time with / without balanced activation checkpointing, config A, N=4",
        Bound::AtMost(1.35),
    ),
    fig(
        "activation_checkpoint_exchange_ratio_a_n4",
        "RTP exchanges per step with / without balanced activation checkpointing, config A, N=4",
        Bound::AtMost(1.0),
    ),
    fig(
        "activation_checkpoint_planner_max_rel_error",
        "memory planner under balanced checkpointing: largest relative error over its grid",
        Bound::AtMost(0.10),
    ),
    fig(
        "decode_rtp_auto_over_single_sequence_b_n4",
        "generation, batch 1 with a KV cache, one sequence's bytes/s: RTP Auto N=4 / single device, config B's shape",
        Bound::AtLeast(0.5),
    ),
];

/// The MPI report's figures against PyTorch, present when it ran with `--pytorch`.
pub const MPI_PYTORCH: &[Figure] = &[
    fig(
        "mpi_rtp_over_pytorch_ddp_step_b_n4",
        "our RTP / PyTorch DDP step time, config B, N=4",
        Bound::AtMost(0.80),
    ),
    fig(
        "mpi_ddp_over_pytorch_ddp_step_a_n4",
        "our DDP / PyTorch DDP step time, config A, N=4",
        Bound::AtMost(1.30),
    ),
    fig(
        "mpi_rtp_over_pytorch_ddp_rss_b_n4",
        "our RTP / PyTorch DDP peak RSS per process, config B, N=4",
        Bound::AtMost(0.20),
    ),
    fig(
        "mpi_rtp_over_pytorch_ddp_step_a_n4",
        "our RTP / PyTorch DDP step time, config A, N=4",
        Bound::Reported,
    ),
    fig(
        "mpi_ddp_over_pytorch_ddp_step_b_n4",
        "our DDP / PyTorch DDP step time, config B, N=4",
        Bound::Reported,
    ),
    fig(
        "mpi_fsdp_over_pytorch_fsdp_step_b_n4",
        "our FSDP / PyTorch FSDP2 step time, config B, N=4",
        Bound::Reported,
    ),
    fig(
        "mpi_rtp_over_pytorch_fsdp_step_b_n4",
        "our RTP / PyTorch FSDP2 step time, config B, N=4",
        Bound::Reported,
    ),
];

/// The MPI scaling report's headline figures (`benches/report/mpi/report.json`).
pub const MPI: &[Figure] = &[
    fig(
        "mpi_rtp_over_ddp_rss_b_n4",
        "RTP / DDP (bucketed, its default) peak RSS per process, config B, N=4",
        Bound::AtMost(0.40),
    ),
    fig(
        "mpi_rtp_over_ddp_step_a_n2",
        "RTP / DDP step time, config A, N=2",
        Bound::AtMost(1.05),
    ),
    fig(
        "mpi_rtp_over_ddp_step_a_n4",
        "RTP / DDP step time, config A, N=4",
        Bound::AtMost(1.05),
    ),
    fig(
        "mpi_rtp_over_ddp_step_b_n2",
        "RTP / DDP step time, config B, N=2",
        Bound::AtMost(1.05),
    ),
    fig(
        "mpi_rtp_over_ddp_step_b_n4",
        "RTP / DDP step time, config B, N=4",
        Bound::AtMost(0.80),
    ),
    fig(
        "mpi_ddp_hidden_fraction_b_n4",
        "share of DDP's all-reduce wire time hidden under the backward, config B, N=4",
        Bound::AtLeast(0.5),
    ),
    fig(
        "mpi_fsdp_hidden_fraction_b_n4",
        "share of FSDP's all-gather wire time its rank did not wait for (prefetched), config B, N=4",
        Bound::Reported,
    ),
    fig(
        "mpi_ddp_over_unbucketed_ddp_step_a_n2",
        "DDP with buckets / without, step time, config A, N=2",
        Bound::AtMost(1.00),
    ),
    fig(
        "mpi_ddp_over_unbucketed_ddp_step_a_n4",
        "DDP with buckets / without, step time, config A, N=4",
        Bound::AtMost(1.00),
    ),
    fig(
        "mpi_ddp_over_unbucketed_ddp_step_b_n2",
        "DDP with buckets / without, step time, config B, N=2",
        Bound::AtMost(1.00),
    ),
    fig(
        "mpi_ddp_over_unbucketed_ddp_step_b_n4",
        "DDP with buckets / without, step time, config B, N=4",
        Bound::AtMost(1.00),
    ),
    fig(
        "mpi_rtp_over_fsdp_step_a_n4",
        "RTP / FSDP step time, config A, N=4",
        Bound::AtMost(1.00),
    ),
    fig(
        "mpi_rtp_over_fsdp_step_b_n4",
        "RTP / FSDP step time, config B, N=4",
        Bound::AtMost(1.00),
    ),
    fig(
        "mpi_capacity_rtp_over_ddp_n4",
        "largest trainable model under a per-process limit, RTP / DDP, N=4",
        Bound::AtLeast(3.5),
    ),
    fig(
        "mpi_overlap_fraction_b_n4",
        "share of wire time hidden behind compute, config B, N=4",
        Bound::AtLeast(0.8),
    ),
    fig(
        "planner_max_rel_error_rss",
        "memory planner: largest relative error against the resident set's growth",
        Bound::AtMost(0.20),
    ),
    fig(
        "mpi_activation_checkpoint_rss_ratio_a_n4",
        "RTP peak RSS per process with / without balanced activation checkpointing, config A, N=4",
        Bound::AtMost(0.60),
    ),
];

/// The shaped-network report's headline figures (`benches/report/net/report.json`): config A
/// at N = 2 over 2 hosts, and the wire bytes of every cell.
pub const NET: &[Figure] = &[
    fig(
        "net_rtp_hidden_fraction_a_n2",
        "RTP's share of wire time hidden under rotation compute, config A, N=2, slowest link predicted to hide it",
        Bound::AtLeast(0.8),
    ),
    fig(
        "net_rtp_step_over_unshaped_a_n2",
        "RTP step time on that link / on the unshaped link, config A, N=2",
        Bound::AtMost(1.10),
    ),
    fig(
        "net_crossover_measured_over_predicted_a_n2",
        "link rate where RTP's step time stops falling, measured / predicted, config A, N=2",
        Bound::Between(0.7, 1.3),
    ),
    fig(
        "net_rtp_over_ddp_step_slowest_a_n2",
        "RTP / DDP step time on the slowest link, config A, N=2",
        Bound::Reported,
    ),
    fig(
        "net_wire_bytes_over_count_max",
        "largest relative deviation of the bytes sent per rank per step from the algorithm's count, every strategy, link and cell",
        Bound::AtMost(0.05),
    ),
];

/// Config B's twins of [`NET`]'s figures, where its links allowed a measurement (they may be
/// missing: B's predicted rate can lie above what a veth link carries here).
pub const NET_B: &[Figure] = &[
    fig(
        "net_rtp_hidden_fraction_b_n2",
        "RTP's share of wire time hidden under rotation compute, config B, N=2, slowest link predicted to hide it",
        Bound::AtLeast(0.8),
    ),
    fig(
        "net_rtp_step_over_unshaped_b_n2",
        "RTP step time on that link / on the unshaped link, config B, N=2",
        Bound::AtMost(1.10),
    ),
    fig(
        "net_crossover_measured_over_predicted_b_n2",
        "link rate where RTP's step time stops falling, measured / predicted, config B, N=2",
        Bound::Between(0.7, 1.3),
    ),
    fig(
        "net_rtp_over_ddp_step_slowest_b_n2",
        "RTP / DDP step time on the slowest link, config B, N=2",
        Bound::Reported,
    ),
];
