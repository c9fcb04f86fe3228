//! Flyweight initialisation: a rank only ever materialises its own shards.

mod common;

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;
use burn_rtp::{launch, Rtp, RtpConfig};
use common::*;

type Dist = burn::backend::Autodiff<Rtp<burn::backend::NdArray>>;

/// Forces lazy parameters to initialise without gathering them.
fn materialise<B: Backend, M: Module<B>>(m: &M) {
    struct Touch;
    impl<B: Backend> ModuleVisitor<B> for Touch {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let _ = param.val();
        }
    }
    m.visit(&mut Touch);
}

#[test]
fn init_peak_is_own_shards_plus_one_shard_even_for_a_model_8x_the_budget() {
    let world = 16;
    let (d_model, d_ff, layers) = (64, 256, 4);
    let out = launch(RtpConfig::new(world).with_shard_threshold(0), |device| {
        device.reset_memory_peak();
        let model = TinyLm::<Dist>::sized(d_model, d_ff, layers, &device);
        materialise(&model);
        let params = model.num_params();
        (device.memory_peak(), device.memory_live(), params)
    })
    .expect("init runs");
    let params = out[0].2;
    let full_bytes = params * 4;
    // The largest parameter is the FF weight [64, 256] or [256, 64] sharded 16 ways.
    let largest_shard = (d_model * d_ff / world) * 4;
    for (rank, (peak, live, _)) in out.iter().enumerate() {
        let budget = live.sharded as usize + largest_shard;
        assert!(
            (peak.total as usize) <= budget,
            "rank {rank}: init peak {} B exceeds own shards {} B + one shard {largest_shard} B",
            peak.total,
            live.sharded
        );
        assert!(
            full_bytes >= 8 * budget,
            "the test model ({full_bytes} B) must be at least 8x the per-rank budget ({budget} B)"
        );
    }
}

#[test]
fn the_same_seed_draws_the_same_model_for_every_world_size() {
    let draw = |world: usize| {
        launch(RtpConfig::new(world).with_shard_threshold(0), |device| {
            Dist::seed(&device, 1234);
            let model = TinyLm::<Dist>::new(&device);
            param_values(&model)
        })
        .expect("init runs")
        .remove(0)
    };
    let one = draw(1);
    let three = draw(3);
    assert_eq!(one, three);
    // And the draw is random-looking, not constant.
    assert!(one[0].iter().any(|v| (v - one[0][0]).abs() > 1e-6));
}
