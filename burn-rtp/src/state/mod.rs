//! What one rank counts and stores, with no communication: the memory ledger, the timeline of
//! rotation intervals, where each parameter's elements live, and checkpoint shard IO.

pub(crate) mod accounting;
pub mod shard_io;
pub mod sharding;
pub mod timeline;
