//! Link probes: how fast a shaped link really carries bytes between two hosts, measured by
//! the MPI transport itself (`scaling-report worker probe JSON`, started in two of the
//! cluster's hosts), since the veth path costs CPU here.

use super::{Link, NetReportConfig};
use crate::worker::Worker;
#[cfg(feature = "mpi")]
use burn_rtp::MpiProgress;
use serde::{Deserialize, Serialize};
#[cfg(feature = "mpi")]
use serde_json::json;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A link probe: rank 0 sends `bytes` to rank 1 through the MPI transport; rank 1 writes the
/// rate it received them at, in Gbit/s, to `out`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Probe {
    /// Bytes to send, after one warm-up message.
    pub bytes: u64,
    /// Where rank 1 writes the measured rate.
    pub out: PathBuf,
}

/// The message size of a link probe.
#[cfg(feature = "mpi")]
const PROBE_MESSAGE: usize = 16 << 20;

/// Runs `probe` as this process's rank (inside `mpirun -np 2`).
#[cfg(feature = "mpi")]
pub fn probe_worker(probe: &Probe) -> Result<(), String> {
    use burn::tensor::TensorData;
    use burn_rtp::transport::{Header, MpiEndpoint, MpiTransport, Payload, Transport};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    let transport = MpiTransport::start(Duration::from_secs(120), MpiProgress::Auto, false, false)
        .map_err(|e| e.to_string())?;
    let ep = MpiEndpoint(Arc::new(transport));
    let t: &dyn Transport<()> = &ep;
    if t.world_size() != 2 {
        return Err(format!(
            "a link probe runs on 2 ranks, not {}",
            t.world_size()
        ));
    }
    let elems = PROBE_MESSAGE / 4;
    let count = (probe.bytes as usize).div_ceil(PROBE_MESSAGE).max(1);
    let header = |part: usize, len: usize| Header {
        seq: 0,
        op: "net-probe".into(),
        part,
        shape: vec![len],
    };
    let fail = |e: burn_rtp::RtpError| e.to_string();
    if t.rank() == 0 {
        let data = Arc::new(TensorData::new(vec![1f32; elems], [elems]));
        let send = |part| {
            t.isend(
                1,
                header(part, elems),
                Payload::Host(data.clone()),
                Vec::new(),
            )
        };
        send(0).map_err(fail)?.wait().map_err(fail)?;
        // Rank 1 is ready: every later byte is timed.
        t.irecv(1, header(1, 1))
            .map_err(fail)?
            .wait()
            .map_err(fail)?;
        let sends = (0..count)
            .map(|k| send(2 + k))
            .collect::<Result<Vec<_>, _>>()
            .map_err(fail)?;
        t.flush().map_err(fail)?;
        for s in sends {
            s.wait().map_err(fail)?;
        }
    } else {
        t.irecv(0, header(0, elems))
            .map_err(fail)?
            .wait()
            .map_err(fail)?;
        let ack = Arc::new(TensorData::new(vec![0f32], [1]));
        let ready = t
            .isend(0, header(1, 1), Payload::Host(ack), Vec::new())
            .map_err(fail)?;
        let started = Instant::now();
        for k in 0..count {
            t.irecv(0, header(2 + k, elems))
                .map_err(fail)?
                .wait()
                .map_err(fail)?;
        }
        let seconds = started.elapsed().as_secs_f64();
        ready.wait().map_err(fail)?;
        let gbit = (count * PROBE_MESSAGE) as f64 * 8.0 / seconds / 1e9;
        std::fs::write(&probe.out, json!({ "gbit_per_s": gbit }).to_string())
            .map_err(|e| format!("cannot write {}: {e}", probe.out.display()))?;
    }
    t.mark_exited();
    Ok(())
}

/// `cluster.sh run` with `hosts` hosts of one rank each on `link`.
pub(super) fn cluster(cfg: &NetReportConfig, hosts: usize, link: Link) -> Command {
    let mut cmd = Command::new("bash");
    cmd.arg(&cfg.script)
        .arg("run")
        .args(["--hosts", &hosts.to_string(), "--slots", "1"])
        .args(["--rate", &link.tc()])
        .args(["--timeout", &cfg.job_timeout_s.to_string()])
        .arg("--");
    cmd
}

/// The rate `link` carries between two hosts, in Gbit/s, by the probe.
pub(super) fn probe_link(
    cfg: &NetReportConfig,
    exe: &Path,
    link: Link,
    scratch: &Path,
) -> Result<f64, String> {
    // The unshaped link is probed as if it carried 20 Gbit/s.
    let gbit = link.gbit().unwrap_or(20.0);
    let bytes = ((gbit * 1e9 / 8.0 * cfg.probe_seconds) as u64).clamp(32 << 20, 1 << 30);
    let probe = Probe {
        bytes,
        out: scratch.join("probe.json"),
    };
    let _ = std::fs::remove_file(&probe.out);
    let mut cmd = Worker::Probe {
        probe: serde_json::to_string(&probe).expect("serialisable"),
    }
    .appended(cluster(cfg, 2, link), exe);
    let out = cmd
        .output()
        .map_err(|e| format!("cannot start {}: {e}", cfg.script.display()))?;
    if !out.status.success() {
        return Err(format!(
            "the probe of the {} link failed ({}):\n{}",
            link.label(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let text = std::fs::read_to_string(&probe.out)
        .map_err(|e| format!("the probe wrote nothing ({}): {e}", probe.out.display()))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    v["gbit_per_s"]
        .as_f64()
        .ok_or_else(|| format!("unreadable probe result {text}"))
}
