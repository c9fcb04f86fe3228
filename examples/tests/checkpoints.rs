//! Checkpoints: resuming is bit-for-bit, consolidation loads into single-device Burn, and bad
//! checkpoints or data are refused with clear errors and no partial state.

mod common;

use burn::backend::NdArray;
use burn_rtp_gpt::checkpoint::{
    consolidate_checkpoint, load_consolidated, Checkpoint, CheckpointError,
};
use burn_rtp_gpt::{train, DataError, Strategy, TrainError};
use common::*;

#[test]
fn resuming_equals_uninterrupted_training_and_consolidation_loads_into_single_device() {
    let dir = temp_dir("resume");
    let straight =
        train::<NdArray>(&tiny(Strategy::Rtp, 3, 20), |_| Default::default(), None).unwrap();

    let mut first = tiny(Strategy::Rtp, 3, 10);
    first.checkpoint_dir = Some(dir.join("ckpt"));
    let a = train::<NdArray>(&first, |_| Default::default(), None).unwrap();
    let checkpoint = a.checkpoint.clone().expect("a checkpoint was written");
    assert!(checkpoint.join("manifest.json").exists());
    // Per-rank shards: one model and one optimizer file per rank, nothing temporary left.
    let names: Vec<String> = std::fs::read_dir(&checkpoint)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names.iter().filter(|n| n.ends_with(".model.mpk")).count(),
        3,
        "{names:?}"
    );
    assert!(!std::fs::read_dir(dir.join("ckpt")).unwrap().any(|e| e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .starts_with(".tmp")));

    let mut second = tiny(Strategy::Rtp, 3, 10);
    second.resume = Some(dir.join("ckpt"));
    second.checkpoint_dir = Some(dir.join("ckpt"));
    let b = train::<NdArray>(&second, |_| Default::default(), None).unwrap();
    let resumed: Vec<f64> = a
        .report
        .losses
        .iter()
        .chain(&b.report.losses)
        .copied()
        .collect();
    assert_eq!(
        resumed, straight.report.losses,
        "resumed training must equal 20 straight steps bit for bit"
    );
    assert_eq!(b.report.final_val_loss, straight.report.final_val_loss);

    // Consolidate the final checkpoint and evaluate it on plain single-device Burn.
    let out = dir.join("full.mpk");
    let manifest = consolidate_checkpoint(b.checkpoint.as_ref().unwrap(), &out).unwrap();
    assert_eq!(manifest.step, 20);
    let cfg = tiny(Strategy::Rtp, 3, 20);
    let single = load_consolidated::<NdArray>(&out, &cfg.model, &Default::default()).unwrap();
    let val = reference_val_loss(&cfg, &single);
    assert!(
        rel_close(val, b.report.final_val_loss, 1e-5),
        "single-device validation loss {val} vs RTP {}",
        b.report.final_val_loss
    );
}

#[test]
fn bad_checkpoints_are_refused() {
    let dir = temp_dir("bad-ckpt");
    let mut cfg = tiny(Strategy::Rtp, 2, 2);
    cfg.checkpoint_dir = Some(dir.join("ckpt"));
    let out = train::<NdArray>(&cfg, |_| Default::default(), None).unwrap();
    let ckpt = out.checkpoint.unwrap();

    // Config mismatch.
    let mut wrong = tiny(Strategy::Rtp, 2, 2);
    wrong.model.d_model = 24;
    wrong.resume = Some(ckpt.clone());
    let err = train::<NdArray>(&wrong, |_| Default::default(), None).unwrap_err();
    assert!(err.to_string().contains("model config"), "{err}");

    // Truncated shard.
    let shard = ckpt.join("rank-00001.model.mpk");
    let bytes = std::fs::read(&shard).unwrap();
    std::fs::write(&shard, &bytes[..bytes.len() / 2]).unwrap();
    let err = Checkpoint::open(&ckpt).unwrap_err();
    assert!(matches!(err, CheckpointError::Truncated { .. }), "{err}");
    assert!(err.to_string().contains("truncated"), "{err}");

    // Corrupt shard of the right size.
    let mut corrupt = bytes.clone();
    let mid = corrupt.len() / 2;
    corrupt[mid] ^= 0xff;
    std::fs::write(&shard, &corrupt).unwrap();
    let mut resume = tiny(Strategy::Rtp, 2, 2);
    resume.resume = Some(ckpt.clone());
    resume.checkpoint_dir = Some(dir.join("ckpt"));
    let err = train::<NdArray>(&resume, |_| Default::default(), None).unwrap_err();
    assert!(err.to_string().contains("checksum"), "{err}");
    // Nothing new was written by the failed resume.
    let steps: Vec<_> = std::fs::read_dir(dir.join("ckpt")).unwrap().collect();
    assert_eq!(steps.len(), 2, "only step-00000002 and `latest` exist");

    // No checkpoint at all.
    let err = Checkpoint::open(&dir.join("nowhere")).unwrap_err();
    assert!(matches!(err, CheckpointError::Missing { .. }), "{err}");
}

#[test]
fn a_root_resumes_from_its_newest_complete_checkpoint_and_keeps_the_last_few() {
    let dir = temp_dir("newest");
    let straight =
        train::<NdArray>(&tiny(Strategy::Rtp, 2, 8), |_| Default::default(), None).unwrap();
    let root = dir.join("ckpt");
    let mut cfg = tiny(Strategy::Rtp, 2, 8);
    cfg.checkpoint_dir = Some(root.clone());
    cfg.checkpoint_every = 2;
    cfg.keep_last = 2;
    train::<NdArray>(&cfg, |_| Default::default(), None).unwrap();
    let mut kept: Vec<String> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    kept.sort();
    assert_eq!(
        kept,
        ["latest", "step-00000006", "step-00000008"],
        "--keep-last 2"
    );

    // The newest checkpoint is cut short: a resume from the root passes it over, says why,
    // and trains on from step 6 to the straight run's losses.
    let shard = root.join("step-00000008").join("rank-00001.optim.mpk");
    let bytes = std::fs::read(&shard).unwrap();
    std::fs::write(&shard, &bytes[..bytes.len() - 1]).unwrap();
    let newest = Checkpoint::newest(&root).unwrap();
    assert_eq!(newest.checkpoint.manifest().step, 6);
    assert_eq!(newest.skipped.len(), 1);
    assert!(newest.skipped[0].dir.ends_with("step-00000008"));
    let said = newest.skipped[0].error.to_string();
    assert!(
        said.contains("rank-00001.optim.mpk") && said.contains("truncated"),
        "{said}"
    );
    let mut resume = tiny(Strategy::Rtp, 2, 2);
    resume.resume = Some(root.clone());
    let out = train::<NdArray>(&resume, |_| Default::default(), None).unwrap();
    assert_eq!(out.report.losses, straight.report.losses[6..]);

    // Named directly, the cut checkpoint is refused; with every checkpoint broken, a resume
    // from the root says none is complete and names the newest one's fault.
    assert!(matches!(
        Checkpoint::open(&root.join("step-00000008")),
        Err(CheckpointError::Truncated { .. })
    ));
    let shard = root.join("step-00000006").join("rank-00000.model.mpk");
    std::fs::write(&shard, b"").unwrap();
    let err = Checkpoint::open(&root).unwrap_err();
    assert!(
        matches!(&err, CheckpointError::NoneComplete { tried: 2, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("step-00000008"), "{err}");
}

/// A checkpoint resumes in another world and strategy (4 → 3 ranks, RTP → FSDP, and back to
/// 2 ranks of DDP): the global batch stays, and training goes on as the uninterrupted run
/// does, to the equivalence suite's tolerance (the averages round differently at each N).
#[test]
fn a_checkpoint_resumes_in_another_world_and_strategy() {
    let dir = temp_dir("reshard-resume");
    let straight =
        train::<NdArray>(&tiny(Strategy::Rtp, 4, 9), |_| Default::default(), None).unwrap();
    let root = dir.join("ckpt");
    let mut first = tiny(Strategy::Rtp, 4, 3);
    first.checkpoint_dir = Some(root.clone());
    let a = train::<NdArray>(&first, |_| Default::default(), None).unwrap();
    let mut second = tiny(Strategy::Fsdp, 3, 3);
    second.resume = Some(root.clone());
    second.checkpoint_dir = Some(root.clone());
    let b = train::<NdArray>(&second, |_| Default::default(), None).unwrap();
    let mut third = tiny(Strategy::Ddp, 2, 3);
    third.resume = Some(root.clone());
    let c = train::<NdArray>(&third, |_| Default::default(), None).unwrap();
    let resumed: Vec<f64> = [a.report.losses, b.report.losses, c.report.losses].concat();
    assert_eq!(resumed.len(), 9);
    for (step, (r, s)) in resumed.iter().zip(&straight.report.losses).enumerate() {
        assert!(
            rel_close(*r, *s, 1e-4),
            "step {step}: resumed {r}, straight {s}"
        );
    }
    assert!(rel_close(
        c.report.final_val_loss,
        straight.report.final_val_loss,
        1e-4
    ));
}

/// Activation checkpointing does not change the numbers: 10 steps with it, resumed for 10
/// without, then 10 with it again, equal 30 straight steps without it, bit for bit (losses,
/// validation loss and the final parameters).
#[test]
fn a_checkpoint_resumes_bit_exactly_under_the_other_activation_checkpointing_setting() {
    use burn_rtp::ActivationCheckpointing::{Balanced, None as Plain};
    let dir = temp_dir("resume-activation-checkpointing");
    let with = |ac, steps| {
        let mut cfg = tiny(Strategy::Rtp, 3, steps);
        cfg.activation_checkpointing = ac;
        cfg
    };
    let mut straight_cfg = with(Plain, 30);
    straight_cfg.checkpoint_dir = Some(dir.join("straight"));
    let straight = train::<NdArray>(&straight_cfg, |_| Default::default(), None).unwrap();
    assert_eq!(straight.report.activation_checkpointing, "none");
    let root = dir.join("ckpt");
    let mut losses = Vec::new();
    let mut last = None;
    for (i, ac) in [Balanced, Plain, Balanced].into_iter().enumerate() {
        let mut cfg = with(ac, 10);
        cfg.checkpoint_dir = Some(root.clone());
        cfg.resume = (i > 0).then(|| root.clone());
        let run = train::<NdArray>(&cfg, |_| Default::default(), None).unwrap();
        assert_eq!(run.report.activation_checkpointing, ac.to_string());
        losses.extend(run.report.losses.clone());
        last = Some(run);
    }
    let last = last.unwrap();
    assert_eq!(
        losses, straight.report.losses,
        "switching activation checkpointing at each resume must not change a loss"
    );
    assert_eq!(last.report.final_val_loss, straight.report.final_val_loss);
    // The final parameters, consolidated and read into single-device Burn, to the bit.
    let values = |run: &burn_rtp_gpt::TrainOutcome, name: &str| -> Vec<Vec<f32>> {
        use burn::module::{Module, ModuleVisitor, Param};
        use burn::tensor::Tensor;
        struct Values(Vec<Vec<f32>>);
        impl ModuleVisitor<NdArray> for Values {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<NdArray, D>>) {
                self.0
                    .push(param.val().into_data().to_vec::<f32>().unwrap());
            }
        }
        let out = dir.join(name);
        consolidate_checkpoint(run.checkpoint.as_ref().unwrap(), &out).unwrap();
        let model =
            load_consolidated::<NdArray>(&out, &straight_cfg.model, &Default::default()).unwrap();
        let mut v = Values(Vec::new());
        model.visit(&mut v);
        v.0
    };
    let (a, b) = (
        values(&last, "switched.mpk"),
        values(&straight, "straight.mpk"),
    );
    assert!(!a.is_empty());
    assert!(a == b, "the final parameters differ");
}

#[test]
fn bad_data_is_refused() {
    let dir = temp_dir("bad-data");
    let mut cfg = tiny(Strategy::Rtp, 2, 1);
    cfg.data = Some(dir.join("missing.txt"));
    let err = train::<NdArray>(&cfg, |_| Default::default(), None).unwrap_err();
    assert!(
        matches!(err, TrainError::Data(DataError::Read { .. })),
        "{err}"
    );

    let binary = dir.join("binary.dat");
    let mut bytes = b"plain text ".repeat(100);
    bytes[500] = 0xff;
    std::fs::write(&binary, &bytes).unwrap();
    cfg.data = Some(binary);
    let err = train::<NdArray>(&cfg, |_| Default::default(), None).unwrap_err();
    assert!(
        matches!(
            err,
            TrainError::Data(DataError::NotUtf8 { offset: 500, .. })
        ),
        "{err}"
    );

    let short = dir.join("short.txt");
    std::fs::write(&short, "too short").unwrap();
    cfg.data = Some(short);
    let err = train::<NdArray>(&cfg, |_| Default::default(), None).unwrap_err();
    assert!(
        matches!(err, TrainError::Data(DataError::TooShort { .. })),
        "{err}"
    );

    let mut cfg = tiny(Strategy::Rtp, 5, 1);
    cfg.batch = 12;
    let err = train::<NdArray>(&cfg, |_| Default::default(), None).unwrap_err();
    assert!(err.to_string().contains("multiple of the 5 ranks"), "{err}");
}
