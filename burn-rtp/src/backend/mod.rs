//! The Burn backend `Rtp<B>`: its type, device and tensor primitive, the op-level state of
//! each rank (around its communication context) and the ops, split by family.

pub(crate) mod device;
pub(crate) mod gathers;
pub(crate) mod ops;
pub(crate) mod pairing;
pub(crate) mod rank;
pub(crate) mod rtp;
pub(crate) mod strategy;
pub(crate) mod tensor;
