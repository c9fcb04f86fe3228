//! The MPI report's capacity search: the largest candidate model that trains 3 steps at
//! N = 4 with every process under a real address-space limit (`prlimit --as`).

use super::launch::run_job;
use super::{Job, MpiReportConfig};
use crate::{InnerBackend, Variant};
use burn_rtp::{human_bytes, ActivationCheckpointing};
use burn_rtp_gpt::GptConfig;
use std::path::Path;

/// A strategy's largest model under the limit, and its parameters.
pub(super) type Largest = (Variant, GptConfig, usize);

/// The world size of the capacity search.
pub(super) const CAPACITY_N: usize = 4;

/// DDP's and RTP's largest model under the limit, and its parameters, by bisection over the
/// (growing) candidates; the smallest candidate is run again afterwards, so that the limit,
/// not a failing model, decides.
pub(super) fn capacity(
    cfg: &MpiReportConfig,
    exe: &Path,
    scratch: &Path,
    log: &dyn Fn(&str),
) -> Result<Vec<Largest>, Box<dyn std::error::Error>> {
    let mut capacity = Vec::new();
    for variant in [Variant::DDP, Variant::RTP_OUT_OF_PLACE] {
        let fits = |model: &GptConfig| -> Result<Option<usize>, String> {
            let job = Job {
                variant,
                model: model.clone(),
                batch_per_rank: 1,
                warmup: 0,
                steps: 3,
                out: scratch.join(format!("capacity-{}.json", variant.name())),
                mpi_progress: cfg.mpi_progress,
                timeline: None,
                activation_checkpointing: ActivationCheckpointing::None,
                backend: InnerBackend::Ndarray,
                threads: None,
                fused_activations: true,
            };
            let r = run_job(exe, CAPACITY_N, &job, Some(cfg.capacity_limit_bytes), &[])?;
            log(&format!(
                "capacity {:<7} d_model {:>5}, {} layer(s) under {} per process: {}",
                variant.name(),
                model.d_model,
                model.layers,
                human_bytes(cfg.capacity_limit_bytes),
                if r.is_some() { "trains" } else { "fails" }
            ));
            Ok(r.map(|r| r.params))
        };
        let c = &cfg.capacity_candidates;
        let (mut lo, mut hi, mut best) = (0usize, c.len(), None);
        while lo < hi {
            let mid = (lo + hi) / 2;
            match fits(&c[mid])? {
                Some(params) => {
                    best = Some((c[mid].clone(), params));
                    lo = mid + 1;
                }
                None => hi = mid,
            }
        }
        let Some((model, params)) = best else {
            return Err(format!(
                "{}: not even the smallest candidate trains under {} per process",
                variant.name(),
                human_bytes(cfg.capacity_limit_bytes)
            )
            .into());
        };
        if fits(&c[0])?.is_none() {
            return Err(format!(
                "{}: the smallest candidate failed on a re-run: the limit, not the model, decides",
                variant.name()
            )
            .into());
        }
        capacity.push((variant, model, params));
    }
    Ok(capacity)
}
