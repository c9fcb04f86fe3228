//! Loading: into the world that saved a checkpoint, exactly, or into any other world by
//! resharding on the host, and consolidating the whole model into one ordinary Burn record.

use super::durable::write_atomic;
use super::{
    io, model_file, optim_file, record_file, reshard, validate, Checkpoint, CheckpointError,
    Manifest, Mpk, MANIFEST,
};
use crate::backend::device::RtpDevice;
use crate::error::RtpError;
use crate::state::shard_io::ShardMap;
use burn::module::AutodiffModule;
use burn::optim::Optimizer;
use burn::record::{Record, Recorder};
use burn::tensor::backend::{AutodiffBackend, Backend};
use serde::de::DeserializeOwned;
use std::path::{Path, PathBuf};

/// The world a checkpoint is loaded into, as [`Checkpoint::load_resharded`] needs it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Target {
    pub rank: usize,
    pub world: usize,
    pub strategy: crate::config::Strategy,
    pub threshold: usize,
}

impl Checkpoint {
    /// The manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The step folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The caller's fields, as saved.
    pub fn user<T: DeserializeOwned>(&self) -> Result<T, CheckpointError> {
        serde_json::from_value(self.manifest.user.clone()).map_err(|e| {
            CheckpointError::BadManifest {
                path: self.dir.join(MANIFEST),
                reason: format!("the caller's fields do not match: {e}"),
            }
        })
    }

    /// Refuses a world whose size, strategy or shard threshold differs from the checkpoint's.
    pub fn check_world<I: Backend>(&self, device: &RtpDevice<I>) -> Result<(), CheckpointError> {
        self.check_config(device.config())
    }

    /// [`Checkpoint::check_world`] before any rank exists: checks the world's configuration.
    pub fn check_config(&self, config: &crate::RtpConfig) -> Result<(), CheckpointError> {
        let m = &self.manifest;
        let pairs = [
            (
                "world size",
                m.world_size.to_string(),
                config.world_size.to_string(),
            ),
            ("strategy", m.strategy.clone(), config.strategy.to_string()),
            (
                "shard threshold",
                m.shard_threshold.to_string(),
                config.shard_threshold.to_string(),
            ),
        ];
        for (what, checkpoint, requested) in pairs {
            if checkpoint != requested {
                return Err(CheckpointError::Mismatch {
                    what: what.into(),
                    checkpoint,
                    requested,
                });
            }
        }
        Ok(())
    }

    /// Loads this rank's shards into `model` and `optim` in the world that saved them,
    /// exactly (training resumes bit for bit). Another world size, strategy or shard
    /// threshold is refused before anything is loaded; see [`Checkpoint::load_resharded`].
    pub fn load<I, B, M, O>(
        &self,
        device: &RtpDevice<I>,
        model: M,
        optim: O,
    ) -> Result<(M, O), CheckpointError>
    where
        I: Backend,
        B: AutodiffBackend<Device = RtpDevice<I>>,
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
    {
        self.check_world(device)?;
        let rank = device.rank();
        let map = &self.manifest.shard_maps[rank];
        let model_bytes = self.read(&model_file(rank))?;
        let optim_bytes = self.read(&optim_file(rank))?;
        self.load_records(device, map, (model, optim), (model_bytes, optim_bytes))
    }

    /// Loads the checkpoint into this world, whatever world and strategy saved it: each rank
    /// reads only the files holding its columns and re-slices them on the host, so no rank
    /// ever holds the full model. Training continues as it would have in the old world.
    pub fn load_resharded<I, B, M, O>(
        &self,
        device: &RtpDevice<I>,
        model: M,
        optim: O,
    ) -> Result<(M, O), CheckpointError>
    where
        I: Backend,
        B: AutodiffBackend<Device = RtpDevice<I>>,
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
    {
        let config = device.config();
        let target = Target {
            rank: device.rank(),
            world: device.world_size(),
            strategy: config.strategy,
            threshold: config.shard_threshold,
        };
        let out = reshard::reshard(self, target)?;
        self.load_records(device, &out.map, (model, optim), (out.model, out.optim))
    }

    /// Writes the whole model as one ordinary Burn record (named MessagePack), assembled on
    /// the host from the ranks' files, and returns the path it wrote.
    ///
    /// The file is the one `NamedMpkFileRecorder` reads for `out`: [`record_file`]`(out)`,
    /// `out` with its extension set to `mpk` as Burn's file recorders set it. So `"model"`
    /// and `"model.mpk"` both write `model.mpk`, and either path loads it back:
    ///
    /// ```no_run
    /// # use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder, Recorder};
    /// # fn f(ckpt: burn_rtp::checkpoint::Checkpoint) -> Result<(), Box<dyn std::error::Error>> {
    /// # type B = burn::backend::NdArray;
    /// # type MyModel = burn::nn::Linear<B>;
    /// let written = ckpt.consolidate("model".as_ref())?; // writes model.mpk
    /// let record = NamedMpkFileRecorder::<FullPrecisionSettings>::new()
    ///     .load("model".into(), &Default::default())?; // reads model.mpk
    /// # let _: <MyModel as burn::module::Module<B>>::Record = record;
    /// # let _ = written;
    /// # Ok(()) }
    /// ```
    pub fn consolidate(&self, out: &Path) -> Result<PathBuf, CheckpointError> {
        let path = record_file(out);
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        write_atomic(&path, &self.consolidated_records()?.0)?;
        Ok(path)
    }

    /// The model and optimizer records of the whole model, as single-device Burn loads them
    /// (named MessagePack bytes), assembled on the host: the checkpoint resharded for a world
    /// of one rank that replicates everything.
    pub fn consolidated_records(&self) -> Result<(Vec<u8>, Vec<u8>), CheckpointError> {
        let single = Target {
            rank: 0,
            world: 1,
            strategy: crate::config::Strategy::Ddp,
            threshold: 0,
        };
        let whole = reshard::reshard(self, single)?;
        Ok((whole.model, whole.optim))
    }

    /// Decodes this rank's records (by `map`) and loads them into `model` and `optim`.
    fn load_records<I, B, M, O>(
        &self,
        device: &RtpDevice<I>,
        map: &ShardMap,
        (model, optim): (M, O),
        (model_bytes, optim_bytes): (Vec<u8>, Vec<u8>),
    ) -> Result<(M, O), CheckpointError>
    where
        I: Backend,
        B: AutodiffBackend<Device = RtpDevice<I>>,
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
    {
        let rank = device.rank();
        let path = self.dir.join(model_file(rank));
        // The record's tensors, in order, must be of the kinds of the model's parameters.
        let kinds: String = param_kinds::<B, M>(&model)
            .into_iter()
            .map(validate::Kind::letter)
            .collect();
        let model_record: M::Record =
            decode::<I, B, _>(device, map, model_bytes, path.clone(), Some(&kinds))?;
        let optim_path = self.dir.join(optim_file(rank));
        let optim_record: O::Record =
            decode::<I, B, _>(device, map, optim_bytes, optim_path, None)?;
        // Burn's `load_record` takes a tensor of any shape: a record whose shapes are not the
        // model's is refused here rather than trained on.
        let expected = param_shapes::<B, M>(&model);
        let model = model.load_record(model_record);
        let got = param_shapes::<B, M>(&model);
        if let Some(i) = (0..expected.len().max(got.len())).find(|&i| expected.get(i) != got.get(i))
        {
            return Err(CheckpointError::Record {
                path,
                reason: format!(
                    "parameter {i} has shape {:?} in the checkpoint, but {:?} in the model",
                    got.get(i),
                    expected.get(i)
                ),
            });
        }
        Ok((model, optim.load_record(optim_record)))
    }
}
/// The kind of every parameter of `module`, in visit order (the order its record holds them).
pub(super) fn param_kinds<B: Backend, M: burn::module::Module<B>>(
    module: &M,
) -> Vec<validate::Kind> {
    use burn::module::{ModuleVisitor, Param};
    use burn::tensor::{Bool, Int, Tensor};
    use validate::Kind;
    struct Kinds(Vec<Kind>);
    impl<B: Backend> ModuleVisitor<B> for Kinds {
        fn visit_float<const D: usize>(&mut self, _: &Param<Tensor<B, D>>) {
            self.0.push(Kind::Float);
        }
        fn visit_int<const D: usize>(&mut self, _: &Param<Tensor<B, D, Int>>) {
            self.0.push(Kind::Int);
        }
        fn visit_bool<const D: usize>(&mut self, _: &Param<Tensor<B, D, Bool>>) {
            self.0.push(Kind::Bool);
        }
    }
    let mut kinds = Kinds(Vec::new());
    module.visit(&mut kinds);
    kinds.0
}

/// The logical shape of every parameter of `module`, in visit order.
fn param_shapes<B: Backend, M: burn::module::Module<B>>(module: &M) -> Vec<Vec<usize>> {
    use burn::module::{ModuleVisitor, Param};
    use burn::tensor::{Bool, Int, Tensor};
    struct Shapes(Vec<Vec<usize>>);
    impl<B: Backend> ModuleVisitor<B> for Shapes {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.0.push(param.val().dims().to_vec());
        }
        fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<B, D, Int>>) {
            self.0.push(param.val().dims().to_vec());
        }
        fn visit_bool<const D: usize>(&mut self, param: &Param<Tensor<B, D, Bool>>) {
            self.0.push(param.val().dims().to_vec());
        }
    }
    let mut shapes = Shapes(Vec::new());
    module.visit(&mut shapes);
    shapes.0
}

/// Decodes a record of this rank's shards (its tensors become shards again by `map`), once
/// its tensors are checked (and, with `kinds`, checked to be of those parameter kinds). A
/// record that makes Burn's decoder or the shard loading panic anyway is
/// [`CheckpointError::Record`], not a panic of the rank.
pub(super) fn decode<I, B, R>(
    device: &RtpDevice<I>,
    map: &ShardMap,
    bytes: Vec<u8>,
    path: PathBuf,
    kinds: Option<&str>,
) -> Result<R, CheckpointError>
where
    I: Backend,
    B: Backend<Device = RtpDevice<I>>,
    R: Record<B>,
{
    let record = |reason: String| CheckpointError::Record {
        path: path.clone(),
        reason,
    };
    let dtypes = validate::tensor_dtypes(&bytes).map_err(record)?;
    if let Some(kinds) = kinds {
        validate::check_kinds(&dtypes, kinds).map_err(record)?;
    }
    let loaded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        device.load_shards(map, || Recorder::<B>::load(&Mpk::default(), bytes, device))
    }));
    match loaded {
        Ok(result) => result.map_err(|e| record(e.to_string())),
        Err(payload) => {
            let reason = payload
                .downcast_ref::<RtpError>()
                .map(ToString::to_string)
                .or_else(|| crate::error::panic_message(payload.as_ref()))
                .unwrap_or_else(|| "the decoder panicked".into());
            Err(record(format!("it does not decode: {reason}")))
        }
    }
}
