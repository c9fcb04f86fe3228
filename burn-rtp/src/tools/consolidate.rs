//! Gathering a sharded model into an ordinary one that single-device Burn loads.

use burn::module::{Module, ModuleMapper, Param};
use burn::record::{PrecisionSettings, Record};
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

struct Gather;

impl<B: Backend> ModuleMapper<B> for Gather {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        let require_grad = tensor.is_require_grad();
        let device = tensor.device();
        let mut full = Tensor::from_data(tensor.into_data(), &device);
        if require_grad {
            full = full.require_grad();
        }
        Param::from_mapped_value(id, full, mapper)
    }
}

/// Replaces every parameter shard with the full parameter (a collective: call it on every
/// rank). The result holds whole parameters on each rank; use it for export, not training.
pub fn gather_module<B: Backend, M: Module<B>>(module: M) -> M {
    module.map(&mut Gather)
}

/// The full record item of a sharded model, ready for `Record::from_item` on any backend
/// (a collective: call it on every rank).
///
/// It stays in memory. To write a file that single-device Burn loads, record the gathered
/// module with Burn's file recorder on one rank, after every rank has gathered:
/// `NamedMpkFileRecorder::<FullPrecisionSettings>::new().record(gather_module(model).into_record(), path)`
/// (which writes `path` with the extension `.mpk`, as its `load` reads it); a sharded
/// checkpoint is written as one file by
/// [`Checkpoint::consolidate`](crate::tools::checkpoint::Checkpoint::consolidate), at the same path.
pub fn consolidate<B: Backend, M: Module<B>, S: PrecisionSettings>(
    module: M,
) -> <M::Record as Record<B>>::Item<S> {
    gather_module(module).into_record().into_item::<S>()
}
