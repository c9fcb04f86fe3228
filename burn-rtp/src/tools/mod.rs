//! Tools on top of a running world: the memory planner, sharded checkpoints, consolidation
//! into an ordinary Burn record, and the placement report.

pub mod checkpoint;
pub(crate) mod consolidate;
pub(crate) mod placement;
pub mod plan;
