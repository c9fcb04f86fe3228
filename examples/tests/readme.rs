//! The README's code is the code that runs: its Rust example is burn-rtp's crate doctest,
//! word for word.

use std::path::Path;

/// The lines of the first fenced block that opens with `fence` in `text`.
fn first_block<'a>(lines: impl Iterator<Item = &'a str>, fence: &str) -> Vec<&'a str> {
    lines
        .skip_while(|l| l.trim_end() != fence)
        .skip(1)
        .take_while(|l| l.trim_end() != "```")
        .collect()
}

#[test]
fn the_readme_example_is_the_crate_doctest() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let lib = std::fs::read_to_string(root.join("burn-rtp/src/lib.rs")).unwrap();
    let in_readme = first_block(readme.lines(), "```rust");
    let doc_lines = lib.lines().take_while(|l| l.starts_with("//!")).map(|l| {
        l.strip_prefix("//! ")
            .unwrap_or(l.trim_start_matches("//!"))
    });
    let in_lib = first_block(doc_lines, "```");
    assert!(in_readme.len() > 10, "no Rust example in the README");
    assert_eq!(
        in_readme, in_lib,
        "README.md's example differs from burn-rtp's crate doctest"
    );
}
