#![doc = include_str!("../../README.md")]
#![warn(missing_docs)]

mod accounting;
mod backend;
pub mod checkpoint;
mod collectives;
mod config;
mod consolidate;
mod device;
mod error;
mod host_view;
mod launch;
mod linear_pairing;
mod ops;
mod optim;
mod p2p;
mod placement;
pub mod plan;
mod ring;
pub mod rotation;
pub mod shard_io;
pub mod sharding;
mod tensor;
pub mod timeline;
pub mod transport;
mod world;

pub use accounting::{
    human_bytes, parse_bytes, peak_rss_bytes, Category, Charge, Ledger, MemoryStats, Phase,
};
pub use backend::Rtp;
pub use burn_rtp_kernels::{set_fused_kernels, KernelPath, RotationKernels};
pub use config::{
    check_rank, Chaos, Delivery, MpiProgress, RotationMode, RtpConfig, Strategy, TransportKind,
    DEFAULT_SHARD_THRESHOLD,
};
pub use consolidate::{consolidate, gather_module};
pub use device::RtpDevice;
pub use device::{enter_rank, register_device, RankGuard};
pub use error::{RtpError, RtpResult};
pub use launch::{launch, try_launch, try_launch_on};
pub use optim::{sync_gradients, GradNorm, RtpOptimizer};
pub use placement::{placement, ParamPlacement, Placement, RtpBackend};
pub use plan::{PlanConfig, PlanError, Planner, Prediction};
pub use shard_io::ShardMap;
pub use sharding::Layout;
pub use tensor::RtpTensor;
