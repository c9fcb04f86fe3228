//! `scaling-report` in its tiny configuration writes the three kinds of file, and the JSON
//! has every headline key with a finite value.

use burn_rtp_benches::report::ReportConfig;
use burn_rtp_benches::runner::Report;

#[test]
fn tiny_scaling_report_writes_json_markdown_and_plots() {
    let out = std::env::temp_dir().join(format!("burn-rtp-scaling-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_scaling-report"))
        .args(["--tiny", "--out"])
        .arg(&out)
        .status()
        .expect("scaling-report runs");
    assert!(status.success(), "scaling-report failed: {status}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    ReportConfig::tiny(out.clone()).check_keys(&json).unwrap();
    for table in [
        "memory",
        "step_time",
        "capacity",
        "memory_scaling_efficiency",
    ] {
        assert!(
            json[table].as_array().is_some_and(|a| !a.is_empty()),
            "table {table} is empty"
        );
    }
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(
        md.contains("cores") && md.contains("ndarray"),
        "report.md states the machine"
    );
    for svg in [
        "memory.svg",
        "efficiency.svg",
        "step_time.svg",
        "capacity.svg",
    ] {
        let text = std::fs::read_to_string(out.join(svg)).unwrap();
        assert!(
            text.starts_with("<svg") && text.contains("</svg>"),
            "{svg} is not an SVG"
        );
    }
    let _ = std::fs::remove_dir_all(out);
}
