//! Typed errors that callers of burn-rtp can act on.

use thiserror::Error;

/// Everything that can go wrong in an RTP world, with the rank that saw it.
///
/// New variants may come in minor releases, so matches need a wildcard arm.
#[derive(Debug, Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum RtpError {
    /// A world must have at least one rank.
    #[error("invalid world size 0: an RTP world needs at least one rank")]
    EmptyWorld,
    /// A rank index was given that does not exist in the world.
    #[error(
        "rank {rank} is outside a world of {world_size} ranks (valid ranks are 0..{world_size})"
    )]
    RankOutOfRange {
        /// The offending rank index.
        rank: usize,
        /// The number of ranks in the world.
        world_size: usize,
    },
    /// Two ranks disagree on the op sequence or on a shape: their programs diverged.
    #[error(
        "rank {rank}: desynchronised with rank {peer} in op `{op}` (collective #{seq}): expected {expected}, got {got}"
    )]
    Desync {
        /// The rank that detected the mismatch.
        rank: usize,
        /// The peer whose message did not match.
        peer: usize,
        /// The op the detecting rank was running.
        op: String,
        /// The detecting rank's collective sequence number.
        seq: u64,
        /// What the detecting rank expected.
        expected: String,
        /// What the peer sent.
        got: String,
    },
    /// Another rank failed, so this rank stopped waiting for it.
    #[error("rank {rank}: op `{op}` aborted because rank {failed_rank} failed: {reason}")]
    PeerFailed {
        /// The rank that gave up.
        rank: usize,
        /// The op it was running.
        op: String,
        /// The rank that failed first.
        failed_rank: usize,
        /// Why that rank failed.
        reason: String,
    },
    /// A peer finished its program while this rank still expected messages from it.
    #[error(
        "rank {rank}: op `{op}` waits for rank {peer}, which has already finished its program"
    )]
    PeerExited {
        /// The waiting rank.
        rank: usize,
        /// The op it was running.
        op: String,
        /// The peer that exited.
        peer: usize,
    },
    /// A peer sent nothing within the configured timeout.
    #[error("rank {rank}: op `{op}` timed out after {secs:.1} s waiting for rank {peer}")]
    Timeout {
        /// The waiting rank.
        rank: usize,
        /// The op it was running.
        op: String,
        /// The silent peer.
        peer: usize,
        /// How long it waited.
        secs: f64,
    },
    /// A rank's program panicked or returned an error.
    #[error("rank {rank} failed: {reason}")]
    RankFailed {
        /// The rank that failed first.
        rank: usize,
        /// Its panic message or error.
        reason: String,
    },
    /// A sharded tensor met a full-size local tensor in a way that has no safe meaning.
    #[error("rank {rank}: op `{op}` mixes a {layout} tensor of shape {shape:?} with a full-size local tensor of the same shape. {hint}")]
    AmbiguousMix {
        /// The rank that saw it.
        rank: usize,
        /// The op.
        op: String,
        /// The layout of the non-local operand.
        layout: String,
        /// The common logical shape.
        shape: Vec<usize>,
        /// What to do about it.
        hint: String,
    },
    /// An op has no shard-wise rule and gathering was disabled.
    #[error("rank {rank}: op `{op}` has no shard-wise rule for shapes {shapes:?} and gather fallback is disabled")]
    NoShardRule {
        /// The rank that saw it.
        rank: usize,
        /// The op.
        op: String,
        /// The logical shapes of the operands.
        shapes: Vec<Vec<usize>>,
    },
    /// A tensor was moved to a device of another rank or world.
    #[error("rank {rank}: cannot move a tensor to {target}; tensors never cross ranks")]
    CrossRank {
        /// The rank that owns the tensor.
        rank: usize,
        /// The target device.
        target: String,
    },
    /// A rank would hold more bytes than its memory cap allows.
    #[error("rank {rank}: out of memory: {requested} B requested with {live} B live, over the cap of {cap} B")]
    OutOfMemory {
        /// The rank.
        rank: usize,
        /// Bytes of the refused allocation.
        requested: u64,
        /// Bytes held at the time.
        live: u64,
        /// The cap.
        cap: u64,
    },
    /// Every device id is held by a live rank; ranks of ended worlds free theirs.
    #[error("cannot register another RTP rank: all {live} device ids are held by live ranks")]
    TooManyDevices {
        /// Ranks alive in this process.
        live: usize,
    },
    /// The configured world size differs from the number of processes `mpirun` started.
    #[error("the configuration asks for {configured} ranks, but mpirun started {launched} processes: pass -np {configured} to mpirun, or configure {launched} ranks")]
    WorldSizeMismatch {
        /// Ranks in the configuration.
        configured: usize,
        /// Processes in the MPI job.
        launched: usize,
    },
    /// The requested transport cannot run here.
    #[error("transport `{transport}` is unavailable: {reason}")]
    TransportUnavailable {
        /// The transport asked for.
        transport: String,
        /// Why it cannot run.
        reason: String,
    },
    /// Ranks were started with different settings; caught before the first step.
    #[error("rank {rank}: ranks disagree on the {field}: this rank has `{ours}`, rank {peer} has `{theirs}`")]
    Disagreement {
        /// The rank that reports it.
        rank: usize,
        /// The first rank whose value differs.
        peer: usize,
        /// The setting.
        field: String,
        /// This rank's value.
        ours: String,
        /// The peer's value.
        theirs: String,
    },
    /// A training value (a loss, a gradient norm) is NaN or infinite on some rank. Every rank
    /// gets this same error from [`crate::RtpDevice::check_finite`], so all stop together.
    #[error("rank {rank}: non-finite {what} at step {step}: rank {bad_rank} has {value}")]
    NonFinite {
        /// The rank that reports it.
        rank: usize,
        /// The training step the caller named.
        step: u64,
        /// What was checked ("loss", "gradient norm").
        what: String,
        /// The lowest rank whose value is not finite.
        bad_rank: usize,
        /// That rank's value as text (`NaN`, `inf` or `-inf`).
        value: String,
    },
    /// A checkpoint's map of shard shapes cannot be written or does not fit this world.
    #[error("rank {rank}: shard map in `{op}`: {reason}")]
    ShardMap {
        /// The rank that saw it.
        rank: usize,
        /// `save_shards` or `load_shards`.
        op: String,
        /// What is ambiguous or does not fit.
        reason: String,
    },
    /// One op was given tensors of two different ranks (tensors never cross ranks).
    #[error("rank {rank}: op `{op}` got a tensor of rank {other} (world {other_world}) beside this rank's own; tensors never cross ranks")]
    MixedRanks {
        /// The rank of the first operand.
        rank: usize,
        /// The op.
        op: String,
        /// The rank of the other operand.
        other: usize,
        /// The world id of the other operand (it may be another world's rank of the same index).
        other_world: u64,
    },
    /// A world ended (its threads stopped) before answering a caller outside it.
    #[error("the RTP world ended before answering: {reason}")]
    WorldEnded {
        /// What the caller was waiting for.
        reason: String,
    },
    /// The transport failed.
    #[error("rank {rank}: transport failure in `{op}`: {reason}")]
    Transport {
        /// The rank that saw it.
        rank: usize,
        /// The op.
        op: String,
        /// The transport's message.
        reason: String,
    },
}

/// Result alias for burn-rtp.
pub type RtpResult<T> = Result<T, RtpError>;

/// The message of a panic whose payload is a string (as `panic!` makes it).
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> Option<String> {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
}

/// Raises an error from inside a backend op, where Burn's signatures allow no `Result`.
///
/// The launcher turns the panic back into an [`RtpError`] for the caller.
pub(crate) fn raise(err: RtpError) -> ! {
    std::panic::panic_any(err)
}
