//! Generation through the KV cache (`burn_rtp_gpt::generate`): against the model's own full
//! forward on one device, window after window, and under RTP at N = 1 to 4 with each routing
//! against single-device generation from the same weights.

mod common;

use burn::backend::NdArray;
use burn::tensor::{Int, Tensor, TensorData};
use burn_rtp::{Routing, Rtp, RtpConfig};
use burn_rtp_gpt::{generate, Decoder, GptConfig, Sampler, Strategy};

/// A two-block model with a context of 8, so that a few dozen bytes refill the cache often.
fn model_config() -> GptConfig {
    GptConfig::new(8, 20, 2, 2)
}

fn tokens(bytes: &[u8]) -> Tensor<NdArray, 2, Int> {
    let ids: Vec<i64> = bytes.iter().map(|&b| i64::from(b)).collect();
    let n = ids.len();
    Tensor::from_data(TensorData::new(ids, [1, n]), &Default::default())
}

/// Each step's cached logits equal the last position of a full forward over the window the
/// cache holds, within 1e-5 (the cached pass multiplies one row where the full one multiplies
/// the window, so the GEMMs may round differently), from a prompt longer than the context
/// and through a refill every half context.
#[test]
fn cached_logits_match_the_full_forward_across_refills() {
    let device = Default::default();
    let cfg = model_config();
    let model = cfg.init::<NdArray>(&device);
    let mut decoder = Decoder::new(&model, cfg.seq, &device);
    let mut sampler = Sampler::new(5, 1.0);
    // A prompt longer than the context: its last 8 bytes fill the cache.
    let mut logits = decoder.start(b"a prompt longer than the context");
    assert_eq!(decoder.window(), b" context");
    for step in 0..40 {
        let window = decoder.window().to_vec();
        let n = window.len();
        let full = model.logits(tokens(&window));
        let vocab = full.dims()[2];
        let last = full.slice([0..1, n - 1..n, 0..vocab]).reshape([vocab]);
        let diff = (logits.clone() - last).abs().max().into_scalar();
        assert!(
            diff <= 1e-5,
            "step {step}, window of {n}: cached and full logits differ by {diff}"
        );
        let byte = sampler.pick(logits) as u8;
        logits = decoder.push(byte);
    }
    // The prompt's pass, then a refill whenever the cache is full: at the first byte, then
    // every 5th (a refill holds the newest 4 bytes; 4 more fill the context of 8).
    assert_eq!(decoder.refills(), 1 + 8, "passes that filled the cache");
    // An empty prompt starts from a newline; no byte asked, no pass made.
    let mut sampler = Sampler::new(5, 1.0);
    assert_eq!(
        generate(&model, &device, b"", 0, cfg.seq, &mut sampler),
        b"\n"
    );
    assert_eq!(
        generate(&model, &device, b"", 3, cfg.seq, &mut sampler).len(),
        4
    );
}

/// RTP at N = 1, 2, 3, 4 (every parameter sharded), with the weights rotating, the
/// activations routed and `Auto`, generates on every rank the bytes single-device Burn
/// generates from the same weights and seed. A decode step has one row per rank, so `Auto`
/// routes every Linear, and at N = 4 its messages carry a small part of rotation's bytes.
#[test]
fn rtp_generates_the_single_device_bytes() {
    let dir = common::temp_dir("generate");
    let mut cfg = common::tiny(Strategy::Rtp, 1, 0);
    cfg.model = model_config();
    let init = common::initial_weights(&cfg, &dir);
    let (prompt, n, seed) = (b"The ".as_slice(), 24, 11);
    let device = Default::default();
    let single =
        burn_rtp_gpt::checkpoint::load_consolidated::<NdArray>(&init, &cfg.model, &device).unwrap();
    let expected = generate(
        &single,
        &device,
        prompt,
        n,
        cfg.model.seq,
        &mut Sampler::new(seed, 0.8),
    );
    assert_eq!(expected.len(), prompt.len() + n);
    for ranks in [1, 2, 3, 4] {
        let mut bytes_moved = Vec::new();
        for routing in [Routing::Weights, Routing::Activations, Routing::Auto] {
            let config = RtpConfig::new(ranks)
                .with_shard_threshold(0)
                .with_routing(routing);
            let runs = burn_rtp::try_launch::<NdArray, _, _, _>(config, |device| {
                let model = burn_rtp_gpt::checkpoint::load_consolidated::<Rtp<NdArray>>(
                    &init, &cfg.model, &device,
                )?;
                let before = device.message_bytes();
                let mut sampler = Sampler::new(seed, 0.8);
                let out = generate(&model, &device, prompt, n, cfg.model.seq, &mut sampler);
                Ok::<_, burn_rtp_gpt::CheckpointError>((out, device.message_bytes() - before))
            })
            .unwrap();
            for (rank, (out, _)) in runs.iter().enumerate() {
                assert_eq!(
                    String::from_utf8_lossy(out),
                    String::from_utf8_lossy(&expected),
                    "N={ranks} {routing}: rank {rank} generated other bytes"
                );
            }
            bytes_moved.push(runs[0].1);
        }
        if ranks == 4 {
            let [weights, activations, auto] = bytes_moved[..] else {
                unreachable!()
            };
            // Auto rotates the refills' passes that are too wide to route (four rows of a
            // Linear 20 wide), and routes every one-row decode step. The embeddings rotate
            // either way (in this tiny model, most of what routing still sends).
            assert!(
                2 * activations < weights && 2 * auto < weights,
                "rotation sent {weights} bytes, routing {activations}, Auto {auto}"
            );
        }
    }
}
