//! Parsing, printing and checking of the settings.

use super::*;

/// Every variant parses back from the name it prints, aliases parse too, and an unknown
/// name's error lists every name.
#[test]
fn names_round_trip_and_errors_list_them() {
    fn round_trip<T>(all: &[T])
    where
        T: std::str::FromStr<Err = String> + std::fmt::Display + PartialEq + std::fmt::Debug,
    {
        for v in all {
            assert_eq!(v.to_string().parse::<T>().as_ref(), Ok(v));
        }
    }
    round_trip(&[RotationMode::OutOfPlace, RotationMode::InPlace]);
    round_trip(&[Routing::Weights, Routing::Activations, Routing::Auto]);
    round_trip(&[MpiProgress::Auto, MpiProgress::Spin, MpiProgress::Backoff]);
    round_trip(&[Strategy::Rtp, Strategy::Fsdp, Strategy::Ddp]);
    round_trip(&[
        TransportKind::InProcess,
        TransportKind::Mpi,
        TransportKind::Nccl,
    ]);
    assert_eq!("oop".parse(), Ok(RotationMode::OutOfPlace));
    assert_eq!("zero3".parse(), Ok(Strategy::Fsdp));
    assert_eq!("inprocess".parse(), Ok(TransportKind::InProcess));
    assert_eq!(
        "dp".parse::<Strategy>().unwrap_err(),
        "unknown strategy `dp`: expected `rtp`, `fsdp` or `ddp`"
    );
    assert_eq!(
        "tcp".parse::<TransportKind>().unwrap_err(),
        "unknown transport `tcp`: expected `in-process`, `mpi` or `nccl`"
    );
}

fn launch_with(vars: &[(&str, &str)]) -> Option<MpiLaunch> {
    let vars: std::collections::HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    launch_from(|name| vars.get(name).cloned())
}

/// Each launcher's variables give the world, Open MPI's first; Slurm's PMIx launch counts
/// this host's tasks from its tasks-per-node list.
#[test]
fn every_launcher_s_variables_give_the_world() {
    let ompi = launch_with(&[
        ("OMPI_COMM_WORLD_SIZE", "4"),
        ("OMPI_COMM_WORLD_RANK", "3"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ("PMI_SIZE", "9"),
        ("PMI_RANK", "8"),
    ])
    .unwrap();
    assert_eq!((ompi.size, ompi.rank, ompi.local_size), (4, 3, 2));
    let pmi = launch_with(&[("PMI_SIZE", "3"), ("PMI_RANK", "1")]).unwrap();
    assert_eq!((pmi.size, pmi.rank, pmi.local_size), (3, 1, 3));
    let slurm = launch_with(&[
        ("SLURM_STEP_NUM_TASKS", "5"),
        ("PMIX_RANK", "4"),
        ("SLURM_STEP_TASKS_PER_NODE", "2(x2),1"),
    ])
    .unwrap();
    assert_eq!((slurm.size, slurm.rank, slurm.local_size), (5, 4, 2));
    assert!(launch_with(&[("PMIX_RANK", "0")]).is_none());
    assert!(launch_with(&[("OMPI_COMM_WORLD_SIZE", "x"), ("OMPI_COMM_WORLD_RANK", "0")]).is_none());
}
