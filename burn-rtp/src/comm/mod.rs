//! Moving tensors between ranks, lowest first: the ring's indices and the transports; the
//! communication context every exchange reads; point-to-point exchanges; then the rotation
//! schedule and the collectives built on it.
//!
//! `collectives` sits one layer above `rotation` on purpose: the ring all-reduce is a
//! reduce-scatter (rotation's travelling buffer) followed by an all-gather (a rotation that
//! writes each shard's columns), so it is made of rotation's two halves rather than a second
//! copy of the ring schedule.

pub(crate) mod background;
pub(crate) mod collectives;
pub(crate) mod context;
pub(crate) mod host_view;
pub(crate) mod p2p;
pub(crate) mod ring;
pub mod rotation;
pub(crate) mod route;
pub mod transport;
