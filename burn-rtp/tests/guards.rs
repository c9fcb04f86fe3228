//! The agreed checks a training loop stops on: a non-finite value on any rank is the same
//! typed error on every rank, naming the step and the first bad rank; a flag raised on one
//! rank is seen by all.

use burn::backend::NdArray;
use burn_rtp::{launch, RtpConfig, RtpError};

/// The value rank `rank` reports at `step` when `poison` ranks go bad at step 3.
fn value(step: u64, rank: usize, poison: &[(usize, f32)]) -> f32 {
    match poison.iter().find(|(r, _)| *r == rank) {
        Some((_, v)) if step == 3 => *v,
        _ => 1.0 + step as f32 / 7.0 + rank as f32 / 3.0,
    }
}

/// Each rank checks steps 1..=4 and stops at its first error, as a training loop does.
fn run(world: usize, poison: Vec<(usize, f32)>) -> Vec<Vec<Result<f32, RtpError>>> {
    launch::<NdArray, _, _>(RtpConfig::new(world), move |device| {
        let mut results = Vec::new();
        for step in 1..=4 {
            let r = device.check_finite(step, "loss", value(step, device.rank(), &poison));
            let failed = r.is_err();
            results.push(r);
            if failed {
                break;
            }
        }
        results
    })
    .unwrap()
}

#[test]
fn a_non_finite_value_on_one_rank_is_the_same_error_on_every_rank() {
    for world in [1, 2, 3, 4, 8] {
        for (bad, value_text) in [
            (f32::NAN, "NaN"),
            (f32::INFINITY, "inf"),
            (f32::NEG_INFINITY, "-inf"),
        ] {
            let first = world / 2;
            // A later rank is bad too: the error names the lowest.
            let mut poison = vec![(first, bad)];
            if first + 1 < world {
                poison.push((first + 1, f32::NAN));
            }
            let all = run(world, poison.clone());
            assert_eq!(all.len(), world);
            for (rank, results) in all.iter().enumerate() {
                assert_eq!(results.len(), 3, "world {world}, rank {rank}: {results:?}");
                // Steps 1 and 2: the mean, summed in rank order (in f64): the same bits
                // everywhere.
                for step in [1u64, 2] {
                    let sum =
                        (0..world).fold(0.0f64, |a, r| a + f64::from(value(step, r, &poison)));
                    assert_eq!(results[step as usize - 1], Ok((sum / world as f64) as f32));
                }
                let want = RtpError::NonFinite {
                    rank,
                    step: 3,
                    what: "loss".into(),
                    bad_rank: first,
                    value: value_text.into(),
                };
                assert_eq!(results[2], Err(want), "world {world}, rank {rank}");
            }
        }
    }
}

#[test]
fn a_flag_raised_on_one_rank_is_seen_by_every_rank() {
    let seen = launch::<NdArray, _, _>(RtpConfig::new(4), |device| {
        (0..4)
            .map(|round| device.any_rank(device.rank() == round && round % 2 == 1))
            .collect::<Vec<bool>>()
    })
    .unwrap();
    for flags in seen {
        assert_eq!(flags, [false, true, false, true]);
    }
}
