//! Each rank computes in a rayon pool of its own share of the cores: the inner backends'
//! parallel kernels (Flex's GEMMs, burn-ndarray's parallel iterators) run on the pool they
//! are called from, so N in-process ranks never take more than the host's cores unless asked.

use burn::backend::NdArray;
use burn_rtp::{launch, RtpConfig};

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[test]
fn ranks_share_the_cores_by_default() {
    for world in [1, 2, 3, 8] {
        let config = RtpConfig::new(world);
        let want = (cores() / world).max(1);
        assert_eq!(config.threads_per_rank_here(), want, "N={world}");
        let pools = launch::<NdArray, _, _>(config, |_| rayon::current_num_threads()).unwrap();
        assert_eq!(pools, vec![want; world], "N={world}: each rank's pool");
    }
}

#[test]
fn a_chosen_count_is_each_ranks_pool() {
    let config = RtpConfig::new(2).with_threads_per_rank(3);
    let pools = launch::<NdArray, _, _>(config, |device| {
        // A rank's thread stays its own: the device it entered is this rank's.
        (device.rank(), rayon::current_num_threads())
    })
    .unwrap();
    assert_eq!(pools, vec![(0, 3), (1, 3)]);
    assert_eq!(
        RtpConfig::new(2)
            .with_threads_per_rank(0)
            .threads_per_rank_here(),
        1,
        "zero threads is taken as one"
    );
}
