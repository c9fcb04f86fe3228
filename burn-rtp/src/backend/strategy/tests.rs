//! The rules of each strategy, checked against what the strategy is documented to do.

use super::*;
use crate::state::sharding::Layout;

fn shape(dims: &[usize]) -> Shape {
    Shape::from(dims.to_vec())
}

#[test]
fn ddp_replicates_and_the_sharding_strategies_split_the_last_dimension() {
    let w = shape(&[7, 10]);
    assert_eq!(placement(Strategy::Ddp, &w, 4, 0), None);
    for s in [Strategy::Fsdp, Strategy::Rtp] {
        let spec = placement(s, &w, 4, 0).expect("sharded");
        assert_eq!((spec.full.clone(), spec.world), (w.clone(), 4));
        // Below the threshold, or with fewer columns than ranks: replicated.
        assert_eq!(placement(s, &w, 4, 71), None);
        assert_eq!(placement(s, &shape(&[7, 3]), 4, 0), None);
    }
}

#[test]
fn each_strategy_uses_a_sharded_weight_its_own_way_and_a_whole_one_as_it_is() {
    let spec = placement(Strategy::Rtp, &shape(&[5, 8]), 2, 0).unwrap();
    let sharded = Layout::Sharded(spec);
    let used = |s: Strategy, l: &Layout| match rules(s).weight_use(l) {
        WeightUse::Whole => "whole",
        WeightUse::Gathered(_) => "gathered",
        WeightUse::Rotated(_) => "rotated",
    };
    assert_eq!(used(Strategy::Fsdp, &sharded), "gathered");
    assert_eq!(used(Strategy::Rtp, &sharded), "rotated");
    for s in [Strategy::Ddp, Strategy::Fsdp, Strategy::Rtp] {
        assert_eq!(used(s, &Layout::Replicated), "whole");
        assert_eq!(used(s, &Layout::Local), "whole");
    }
}

#[test]
fn in_flight_bytes_follow_each_strategys_rule() {
    // Three Linears of 8 x 12 with a bias each, at 4 bytes, over 4 ranks: rank 0's shard of a
    // weight is 8 x 3, its bundle (weight and bias shards) 27 elements; a whole bundle 108.
    let shapes: Vec<Shape> = [[8, 12].as_slice(), &[12]]
        .iter()
        .cycle()
        .take(6)
        .map(|d| shape(d))
        .collect();
    let model = |bucket_bytes, split| ModelShapes {
        shapes: &shapes,
        elem: 4,
        threshold: 0,
        bucket_bytes,
        split,
        routed: &[],
    };
    let rtp = rules(Strategy::Rtp).in_flight(&model(0, &[]), 4);
    assert_eq!((rtp.forward, rtp.backward), (2 * 27 * 4, 4 * 27 * 4));
    // A layer whose backward runs as two passes holds two bundles at a time.
    let split = [shape(&[8, 12])];
    let rtp_split = rules(Strategy::Rtp).in_flight(&model(0, &split), 4);
    assert_eq!(rtp_split.backward, 2 * 27 * 4);
    // Weights whose every pass routes stay home: all three do here, so nothing rotates.
    let routed = [shape(&[8, 12])];
    let stay = ModelShapes {
        routed: &routed,
        ..model(0, &[])
    };
    let none = rules(Strategy::Rtp).in_flight(&stay, 4);
    assert_eq!((none.forward, none.backward), (0, 0));
    let fsdp = rules(Strategy::Fsdp).in_flight(&model(0, &[]), 4);
    // (2 - 1/4) whole bundles, and the third weight's gather ahead.
    assert_eq!(
        fsdp.backward,
        (108.0 * 4.0 * 1.75f64).round() as u64 + 108 * 4
    );
    let ddp = rules(Strategy::Ddp).in_flight(&model(0, &[]), 4);
    assert_eq!(ddp.update, 96 * 4 / 4 + 96 * 4);
    let bucketed = rules(Strategy::Ddp).in_flight(&model(1 << 20, &[]), 4);
    assert_eq!(bucketed.update, 3 * 108 * 4 + (3 * 108 * 4u64).div_ceil(4));
}

#[test]
fn auto_routes_where_the_tokens_weigh_less_than_the_weights() {
    use crate::config::Routing;
    let auto = rtp::RtpRank {
        routing: Routing::Auto,
        world: 4,
    };
    let routes = |rows, d_in, d_out, backward| {
        let pass = LinearPass {
            rows: rows as f64,
            d_in,
            d_out,
            backward,
            x_on_owners: false,
        };
        <rtp::RtpRank as RankStrategy<burn::backend::NdArray>>::routes_activations(&auto, &pass)
    };
    // Config B's MLP (32 tokens per rank, 768 -> 3072): routing moves a twelfth.
    let (rotate, route) = rtp::elements_moved(
        &LinearPass {
            rows: 32.0,
            d_in: 768,
            d_out: 3072,
            backward: None,
            x_on_owners: false,
        },
        4,
    );
    assert_eq!(
        (rotate, route),
        (
            0.75 * 768.0 * 3072.0,
            3.0 * 32.0 * 768.0 + 0.75 * 32.0 * 3072.0
        )
    );
    for backward in [
        None,
        Some((true, true)),
        Some((true, false)),
        Some((false, true)),
    ] {
        assert!(routes(32, 768, 3072, backward), "{backward:?}");
        // Config A's MLP (512 tokens per rank, 256 -> 1024): rotation moves less.
        assert!(!routes(512, 256, 1024, backward), "{backward:?}");
    }
    // Within the margin, rotation stays: routing 1.1x less is not enough.
    let d = 64;
    let rows = (0.75 * (d * d) as f64 / 1.1 / (3.0 * d as f64 + 0.75 * d as f64)) as usize;
    assert!(!routes(rows, d, d, None));
    // Only the bias's gradient: nothing rotates that routing could save.
    assert!(!routes(32, 768, 3072, Some((false, false))));
    // Owners that kept `x` from the routed forward: dW and a repeated forward send no `x`.
    let kept = |backward| LinearPass {
        rows: 32.0,
        d_in: 768,
        d_out: 3072,
        backward,
        x_on_owners: true,
    };
    let (x, y) = (3.0 * 32.0 * 768.0, 0.75 * 32.0 * 3072.0);
    assert_eq!(rtp::elements_moved(&kept(None), 4).1, y);
    assert_eq!(rtp::elements_moved(&kept(Some((true, true))), 4).1, y + x);
    assert_eq!(rtp::elements_moved(&kept(Some((false, true))), 4).1, y);
}
