//! The report file has the fixed keys, with finite values.

mod common;

use burn::backend::NdArray;
use burn_rtp_gpt::report::REPORT_KEYS;
use burn_rtp_gpt::{train, Strategy};
use common::*;

#[test]
fn report_has_every_key_with_finite_values() {
    let out = train::<NdArray>(&tiny(Strategy::Rtp, 2, 3), |_| Default::default(), None).unwrap();
    let json = serde_json::to_value(&out.report).unwrap();
    let obj = json.as_object().unwrap();
    for key in REPORT_KEYS {
        assert!(obj.contains_key(key), "missing key {key}");
    }
    for key in [
        "tokens_per_s",
        "step_time_ms_median",
        "final_train_loss",
        "final_val_loss",
    ] {
        let v = obj[key].as_f64().unwrap();
        assert!(v.is_finite() && v > 0.0, "{key} = {v}");
    }
    assert_eq!(obj["strategy"], "rtp");
    assert_eq!(obj["ranks"], 2);
    assert_eq!(obj["losses"].as_array().unwrap().len(), 3);
    let peaks = obj["peak_bytes_per_rank"].as_array().unwrap();
    assert_eq!(peaks.len(), 2);
    for p in peaks {
        for k in ["sharded", "local", "in_flight", "total"] {
            assert!(p[k].as_u64().unwrap() > 0, "{k} in {p}");
        }
    }
    assert!(obj["ideal_model_state_bytes_per_rank"].as_u64().unwrap() > 0);
}
