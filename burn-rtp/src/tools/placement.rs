//! The placement report: where each parameter of a model lives on this rank.
//!
//! The shard threshold ([`RtpConfig::with_shard_threshold`](crate::RtpConfig::with_shard_threshold))
//! and the rule that a sharded dimension needs a column for every rank leave some parameters
//! whole on every rank. [`placement`] lists every float parameter of a module with its
//! layout and the bytes this rank holds for it, so that a port can see which ones.
//!
//! ```
//! use burn::backend::{Autodiff, NdArray};
//! use burn::nn::{LayerNormConfig, LinearConfig};
//! use burn_rtp::{launch, placement, Rtp, RtpConfig};
//!
//! type B = Autodiff<Rtp<NdArray>>;
//! let reports = launch(RtpConfig::new(2).with_shard_threshold(1000), |device| {
//!     let fc = LinearConfig::new(64, 32).init::<B>(&device); // 2048 elements: sharded
//!     let norm = LayerNormConfig::new(32).init::<B>(&device); // 32 elements: replicated
//!     (placement(&fc), placement(&norm))
//! })
//! .unwrap();
//! let (fc, norm) = &reports[0];
//! println!("{fc}"); // a table: parameter, shape, layout, shape and bytes on this rank
//! assert_eq!(fc.params[0].path, "weight");
//! assert_eq!(fc.params[0].local_shape, vec![64, 16]);
//! assert_eq!(fc.num_replicated(), 1); // the bias: 32 elements, under the threshold
//! assert_eq!(norm.num_sharded(), 0);
//! assert_eq!(norm.summary(), "0 sharded (0 B on this rank), 2 replicated (256 B)");
//! ```

use crate::backend::rtp::Rtp;
use crate::backend::tensor::RtpTensor;
use crate::state::accounting::human_bytes;
use crate::state::sharding::Layout;
use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, Tensor, TensorMetadata, TensorPrimitive};
use burn_rtp_kernels::RotationKernels;
use std::fmt;

/// A backend whose float tensors are RTP tensors: `Rtp<I>` and `Autodiff<Rtp<I>>`.
pub trait RtpBackend: Backend {
    /// The backend `Rtp` decorates.
    type Inner: RotationKernels;

    /// The RTP tensor a float primitive of this backend holds.
    fn rtp_tensor(t: Self::FloatTensorPrimitive) -> RtpTensor<Self::Inner>;
}

impl<I: RotationKernels> RtpBackend for Rtp<I> {
    type Inner = I;

    fn rtp_tensor(t: RtpTensor<I>) -> RtpTensor<I> {
        t
    }
}

impl<B, I> RtpBackend for B
where
    B: AutodiffBackend<InnerBackend = Rtp<I>>,
    I: RotationKernels,
{
    type Inner = I;

    fn rtp_tensor(t: Self::FloatTensorPrimitive) -> RtpTensor<I> {
        B::inner(t)
    }
}

/// Where one parameter lives on this rank.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamPlacement {
    /// Its path in the module, by field names and indices (`blocks.0.mlp.fc1.weight`).
    pub path: String,
    /// Its full (logical) shape.
    pub shape: Vec<usize>,
    /// Its layout: sharded (this rank holds a range of the last dimension), replicated (every
    /// rank holds it whole) or local (a per-rank value that is no parameter of the world).
    pub layout: Layout,
    /// The shape this rank holds.
    pub local_shape: Vec<usize>,
    /// The bytes this rank holds for it (the parameter only: its gradient and optimizer
    /// state, when they exist, are placed like it).
    pub local_bytes: usize,
    /// Its element type.
    pub dtype: DType,
}

impl ParamPlacement {
    /// Bytes of the whole parameter.
    pub fn full_bytes(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.size()
    }

    /// The layout's name: `sharded`, `replicated` or `local`.
    pub fn layout_name(&self) -> &'static str {
        self.layout.name()
    }
}

/// Where every float parameter of a module lives on one rank, from [`placement`].
///
/// `Display` writes a table (one row per parameter, with human-readable bytes) and the
/// [`summary`](Self::summary) line.
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    /// The rank described (0 for a module without float parameters).
    pub rank: usize,
    /// The number of ranks of its world (1 for a module without float parameters).
    pub world_size: usize,
    /// Every float parameter, in the module's visit order.
    pub params: Vec<ParamPlacement>,
}

impl Placement {
    fn with_layout(&self, name: &'static str) -> impl Iterator<Item = &ParamPlacement> + '_ {
        self.params.iter().filter(move |p| p.layout_name() == name)
    }

    /// How many parameters are sharded.
    pub fn num_sharded(&self) -> usize {
        self.with_layout("sharded").count()
    }

    /// How many parameters are replicated.
    pub fn num_replicated(&self) -> usize {
        self.with_layout("replicated").count()
    }

    /// How many parameters are local: created outside parameter initialisation (say with
    /// `Param::from_tensor` on a computed tensor), so that each rank holds its own value.
    pub fn num_local(&self) -> usize {
        self.with_layout("local").count()
    }

    /// Bytes of this rank's shards.
    pub fn sharded_bytes(&self) -> usize {
        self.with_layout("sharded").map(|p| p.local_bytes).sum()
    }

    /// Bytes of the replicated parameters (the same on every rank).
    pub fn replicated_bytes(&self) -> usize {
        self.with_layout("replicated").map(|p| p.local_bytes).sum()
    }

    /// Bytes of the local parameters.
    pub fn local_bytes(&self) -> usize {
        self.with_layout("local").map(|p| p.local_bytes).sum()
    }

    /// Bytes of parameters this rank holds, whatever their layout.
    pub fn rank_bytes(&self) -> usize {
        self.params.iter().map(|p| p.local_bytes).sum()
    }

    /// Bytes of the whole model, every parameter at its full shape.
    pub fn full_bytes(&self) -> usize {
        self.params.iter().map(ParamPlacement::full_bytes).sum()
    }

    /// One line: `12 sharded (1.02 MiB on this rank), 3 replicated (4.00 KiB)`, and the local
    /// parameters when there are any.
    pub fn summary(&self) -> String {
        let bytes = |b: usize| human_bytes(b as u64);
        let mut line = format!(
            "{} sharded ({} on this rank), {} replicated ({})",
            self.num_sharded(),
            bytes(self.sharded_bytes()),
            self.num_replicated(),
            bytes(self.replicated_bytes())
        );
        if self.num_local() > 0 {
            line += &format!(
                ", {} local ({})",
                self.num_local(),
                bytes(self.local_bytes())
            );
        }
        line
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shape = |s: &[usize]| format!("{s:?}");
        let header = ["parameter", "shape", "layout", "on this rank", "bytes here"];
        let rows: Vec<[String; 5]> = self
            .params
            .iter()
            .map(|p| {
                [
                    p.path.clone(),
                    shape(&p.shape),
                    p.layout_name().to_string(),
                    shape(&p.local_shape),
                    human_bytes(p.local_bytes as u64),
                ]
            })
            .collect();
        let mut widths = header.map(str::len);
        for row in &rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        writeln!(f, "placement on rank {} of {}:", self.rank, self.world_size)?;
        let header = header.map(str::to_string);
        for row in std::iter::once(&header).chain(&rows) {
            // Names left-aligned, figures right-aligned.
            writeln!(
                f,
                "  {:<w0$}  {:<w1$}  {:<w2$}  {:<w3$}  {:>w4$}",
                row[0],
                row[1],
                row[2],
                row[3],
                row[4],
                w0 = widths[0],
                w1 = widths[1],
                w2 = widths[2],
                w3 = widths[3],
                w4 = widths[4],
            )?;
        }
        write!(
            f,
            "  {}; {} here of the model's {}",
            self.summary(),
            human_bytes(self.rank_bytes() as u64),
            human_bytes(self.full_bytes() as u64)
        )
    }
}

/// Collects each float parameter's placement, with its path from the visitor's module names.
struct Collect {
    path: Vec<String>,
    rank: Option<(usize, usize)>,
    params: Vec<ParamPlacement>,
}

impl<B: RtpBackend> ModuleVisitor<B> for Collect {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let t = match param.val().into_primitive() {
            TensorPrimitive::Float(t) => B::rtp_tensor(t),
            TensorPrimitive::QFloat(_) => return,
        };
        self.rank.get_or_insert((t.rank(), t.ctx.comm.world_size));
        let path = match self.path.is_empty() {
            true => param.id.to_string(),
            false => self.path.join("."),
        };
        let local_shape = t.inner_shape();
        let dtype = t.inner.dtype();
        self.params.push(ParamPlacement {
            path,
            shape: t.dims(),
            layout: t.layout.clone(),
            local_bytes: local_shape.iter().product::<usize>() * dtype.size(),
            local_shape,
            dtype,
        });
    }
}

/// Where every float parameter of `module` lives on this rank: its path, full shape, layout
/// and the shape and bytes this rank holds, with totals by layout (see [`Placement`]).
///
/// Works on `Rtp<I>` and `Autodiff<Rtp<I>>` modules alike. It reads no other rank (no
/// collective), and a parameter still waiting for its lazy initialisation is initialised,
/// as its first use would.
pub fn placement<B: RtpBackend, M: Module<B>>(module: &M) -> Placement {
    let mut collect = Collect {
        path: Vec::new(),
        rank: None,
        params: Vec::new(),
    };
    module.visit(&mut collect);
    let (rank, world_size) = collect.rank.unwrap_or((0, 1));
    Placement {
        rank,
        world_size,
        params: collect.params,
    }
}
