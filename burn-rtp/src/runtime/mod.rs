//! What a training program calls around the backend: starting worlds and the optimizer
//! wrapper.

pub(crate) mod adam;
pub(crate) mod launch;
pub(crate) mod optim;
