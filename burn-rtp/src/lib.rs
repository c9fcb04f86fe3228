//! Rotated Tensor Parallelism (RTP) for [Burn](https://burn.dev) 0.21, as a backend
//! decorator.
//!
//! Change the backend type from `Autodiff<B>` to `Autodiff<Rtp<B>>` and run the same training
//! code on N ranks: each rank keeps 1/N of every parameter, its gradient and its optimizer
//! state. Inside every `Linear` and `Embedding`, forward and backward, weight shards rotate
//! around a ring of ranks while each rank computes with the shard on hand; the weight gradient
//! is reduced on its way around the ring, so no gradient ever exists in full. Training gives
//! single-device Burn's losses, to rounding.
//!
//! # Example
//!
//! Four in-process ranks train one `Linear` with Adam; each holds a quarter of its weight and
//! of Adam's moments.
//!
//! ```
//! use burn::backend::{Autodiff, NdArray};
//! use burn::nn::{Linear, LinearConfig};
//! use burn::optim::{AdamConfig, GradientsParams, Optimizer};
//! use burn::tensor::{Distribution, Tensor};
//! use burn_rtp::{launch, Rtp, RtpConfig, RtpOptimizer};
//!
//! type B = Autodiff<Rtp<NdArray>>; // was Autodiff<NdArray>
//!
//! fn main() -> Result<(), burn_rtp::RtpError> {
//!     // One closure per rank; `launch` returns each rank's result in rank order.
//!     let last_losses = launch(RtpConfig::new(4), |device| {
//!         let mut model: Linear<B> = LinearConfig::new(32, 48).init(&device);
//!         let mut optim = RtpOptimizer::new(AdamConfig::new().init()); // the one extra line
//!         let mut loss_value = 0.0;
//!         for _step in 0..3 {
//!             // This rank's slice of the global batch.
//!             let x = Tensor::<B, 2>::random([8, 32], Distribution::Default, &device);
//!             let loss = model.forward(x).powf_scalar(2.0).mean();
//!             loss_value = device.all_reduce_mean(loss.clone().into_scalar());
//!             let grads = GradientsParams::from_grads(loss.backward(), &model);
//!             model = optim.step(1e-3, model, grads);
//!         }
//!         loss_value // the mean over ranks: the same on every rank
//!     })?;
//!     assert!(last_losses.iter().all(|l| *l == last_losses[0]));
//!     Ok(())
//! }
//! ```
//!
//! * [`launch`] runs the closure once per rank: on threads of this process by default, or,
//!   started by `mpirun` with the `mpi` feature, once in this process as its rank.
//! * [`RtpOptimizer`] wraps any Burn optimizer. It averages over ranks the gradients of
//!   parameters used outside `Linear` and `Embedding` (LayerNorm gains, say) and shards them
//!   like their parameter; forgetting it is [`RtpError::AmbiguousMix`], never a wrong result.
//! * [`RtpConfig`] picks the strategy ([`Strategy::Rtp`], or the [`Strategy::Fsdp`] and
//!   [`Strategy::Ddp`] baselines), the rotation mode, the shard threshold
//!   ([`DEFAULT_SHARD_THRESHOLD`] is 0: every parameter sharded), the transport and its timeouts.
//! * [`checkpoint`] saves and loads sharded checkpoints, reshards them into another world and
//!   consolidates them into an ordinary Burn record; [`plan`] predicts each rank's peak memory
//!   before a run.
//!
//! # Feature flags
//!
//! | feature | what it adds |
//! |---|---|
//! | (none) | `Rtp<NdArray>`; in-process ranks; NdArray's native rotation steps |
//! | `flex` | `Rtp<Flex>`, Burn 0.21's pure-Rust CPU backend (the gemm crate, strided views, f16 and bf16) |
//! | `mpi` | one rank per process under `mpirun`, on Open MPI (needs `libopenmpi-dev` and `libclang-dev` to build) |
//! | `wgpu` | `Rtp<Wgpu>` with the fused `#[cube]` rotation kernels (runs on Mesa's lavapipe) |
//! | `cuda` | `Rtp<Cuda>` with the fused `#[cube]` kernels; it compiles, and has not yet run on a GPU |
//! | `nccl` | one rank per process and GPU under `mpirun`: tensors move over NCCL, control messages over MPI (needs `cuda` and `mpi`; runs only where libnccl and NVIDIA GPUs are) |
//!
//! # Inner backends
//!
//! `Rtp<B>` needs `B: RotationKernels`, which burn-rtp-kernels implements for the backends
//! below (the orphan rule keeps users from adding it for Burn's own types). Every op of Burn's
//! backend traits reaches `B`'s own implementation (`tests/forwarding.rs`).
//!
//! | inner backend | feature | builds in CI | tested in CI | rotation steps |
//! |---|---|---|---|---|
//! | `NdArray` | (none) | yes | equivalence at N = 1, 2, 3, 4, 8; MPI | native GEMM on strided views |
//! | `Flex` | `flex` | yes | equivalence at N = 1, 2, 3, 4, 8 | Burn's ops (the gemm crate on views) |
//! | `Wgpu` (a `CubeBackend`) | `wgpu` | yes | equivalence at N = 2, 3 on lavapipe | fused `#[cube]` kernels |
//! | `Cuda` (a `CubeBackend`) | `cuda` | yes | needs a GPU | fused `#[cube]` kernels |
//! | `Fusion<B>` over a cube backend | burn-rtp-kernels' `fusion` | no | no | Burn's ops, fused by Fusion |
//!
//! Not covered yet, and why:
//!
//! * **Candle.** It builds offline and would join with a one-line impl behind a feature; it is
//!   left out until its build fits CI's time budget beside the others.
//! * **LibTorch.** Burn 0.21's `tch` 0.22 links libtorch 2.9.0, which pip's `torch==2.9.0`
//!   wheel carries (`LIBTORCH_USE_PYTORCH=1`); that wheel, with the NVIDIA libraries it
//!   depends on, is a large download that CI's machines do not have yet.
//! * **Router and Dispatch.** They wrap other backends behind a runtime choice; `Rtp` wraps
//!   the backend itself instead, so a user picks the backend in the type.
//! * **The cubecl CPU runtime** (`burn-cpu`). Its build script downloads LLVM, which fails
//!   offline; it is a `CubeBackend`, so the cube impl above covers its type.
//!
//! # Process-wide effects
//!
//! The crate changes state that the whole process shares in these places, and nowhere else:
//!
//! * **A panic hook.** While a world runs, [`launch`] installs a hook that prints an
//!   [`RtpError`] raised inside a backend op as one readable line, and hands every other panic
//!   to the hook that was in place before it; when the last running world ends, that hook is
//!   put back.
//! * **The glibc malloc arenas, under MPI only.** Before its communication thread starts, the
//!   MPI transport calls `mallopt(M_ARENA_MAX, 1)` unless `MALLOC_ARENA_MAX` is set, so that
//!   received buffers are not faulted in again after each trim of a second arena. The
//!   application that embeds the crate then allocates from one arena too;
//!   `RtpConfig::with_one_malloc_arena(false)` leaves the allocator alone.
//! * **glibc's mmap and trim thresholds, under MPI only.** The MPI transport also raises them
//!   (32 MiB and 1 GiB) unless the environment sets them, so that each step reuses the pages
//!   the previous one freed instead of faulting fresh ones in;
//!   `RtpConfig::with_keep_freed_pages(false)` leaves them alone.
//! * **The fused-kernel switch.** [`set_fused_kernels`] chooses, for every rank of the process,
//!   between the crate's own rotation kernels and the compositions of Burn ops they replace.
//! * **The GEMM tiling override** (`burn_rtp_kernels::set_gemm_tiling`, cube backends only)
//!   forces one register tiling for every fused GEMM launched from then on.
//! * **The device registry.** Each live rank holds a registered [`RtpDevice`] id, released
//!   when the rank ends; [`register_device`] adds one by hand.
//!
//! The repository's `docs/` folder explains the design (`architecture.md`), multi-process runs
//! (`mpi.md`), porting a model (`porting.md`), the tests and the performance reports.
#![warn(missing_docs)]

// The folders are the layers, lowest first: `state` (what a rank counts and stores), `comm`
// (moving tensors between ranks), `backend` (the Burn backend and its ops), `runtime`
// (starting worlds, the optimizer wrapper) and `tools` (planner, checkpoints). A module
// uses only modules below it; `tests/layering.rs` holds the map.
mod backend;
mod comm;
mod config;
mod error;
mod runtime;
mod state;
mod tools;

pub use comm::{rotation, transport};
pub use state::{shard_io, sharding, timeline};
pub use tools::{checkpoint, plan};

pub use backend::device::{enter_rank, register_device, RankGuard};
pub use backend::device::{DdpBuckets, FsdpPrefetches, RtpDevice};
pub use backend::rtp::Rtp;
pub use backend::strategy::placement as shard_placement;
pub use backend::tensor::RtpTensor;
pub use burn_rtp_kernels::{set_fused_kernels, KernelPath, RotationKernels};
pub use config::{
    check_rank, ActivationCheckpointing, Chaos, Delivery, MpiProgress, RotationMode, Routing,
    RtpConfig, Strategy, TransportKind, DEFAULT_DDP_BUCKET_BYTES, DEFAULT_SHARD_THRESHOLD,
};
pub use error::{RtpError, RtpResult};
pub use runtime::adam::FusedAdam;
pub use runtime::launch::{launch, try_launch, try_launch_on};
pub use runtime::optim::{sync_gradients, GradNorm, RtpOptimizer};
pub use state::accounting::{
    human_bytes, minor_page_faults, parse_bytes, peak_rss_bytes, Category, Charge, Ledger,
    MemoryStats, Phase,
};
pub use state::shard_io::ShardMap;
pub use state::sharding::Layout;
pub use tools::consolidate::{consolidate, gather_module};
pub use tools::placement::{placement, ParamPlacement, Placement, RtpBackend};
pub use tools::plan::{PlanConfig, PlanError, Planner, Prediction};
