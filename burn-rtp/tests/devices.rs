//! Device ids: Burn knows a rank by a 16-bit id, so ids of ended worlds must be reused, and
//! two live ranks must never share one.

use burn::backend::NdArray;
use burn::tensor::backend::Device;
use burn_rtp::transport::InProcessHub;
use burn_rtp::{register_device, RtpConfig, RtpDevice, RtpError};
use std::sync::Arc;
use std::time::Duration;

fn one_rank_world() -> Result<RtpDevice<NdArray>, RtpError> {
    let hub = InProcessHub::new(1, Duration::from_secs(1));
    register_device::<NdArray>(
        0,
        1,
        Default::default(),
        Arc::new(hub.endpoint(0)),
        RtpConfig::new(1).with_shard_threshold(0),
    )
}

#[test]
fn ids_neither_saturate_nor_collide() {
    let kept = one_rank_world().unwrap();
    let kept_id = kept.to_id();
    // More worlds than there are ids, one at a time, with two ranks alive in each round.
    for round in 0..70_000 {
        let a = one_rank_world().unwrap();
        let b = one_rank_world().unwrap();
        let (ia, ib) = (a.to_id(), b.to_id());
        assert_ne!(ia, ib, "round {round}: two live ranks share id {ia:?}");
        assert_ne!(
            ia, kept_id,
            "round {round}: a new rank took a live rank's id"
        );
        assert_ne!(
            ib, kept_id,
            "round {round}: a new rank took a live rank's id"
        );
        assert_eq!(RtpDevice::<NdArray>::from_id(ia), a, "round {round}");
        assert_eq!(RtpDevice::<NdArray>::from_id(ib), b, "round {round}");
    }
    assert_eq!(RtpDevice::<NdArray>::from_id(kept_id), kept);

    // Filling every id is a typed error, not a shared id; ending a world frees its ids.
    let mut live = vec![kept];
    let err = loop {
        match one_rank_world() {
            Ok(d) => live.push(d),
            Err(e) => break e,
        }
    };
    assert_eq!(err, RtpError::TooManyDevices { live: 65_536 });
    assert_eq!(live.len(), 65_536);
    let mut ids: Vec<_> = live.iter().map(|d| d.to_id().index_id).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 65_536, "live ranks share ids");
    live.truncate(1);
    let again = one_rank_world().expect("ids of dropped ranks are free again");
    assert_ne!(again.to_id(), live[0].to_id());
}
