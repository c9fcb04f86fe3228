//! Every op of Burn's backend traits reaches the inner backend: `Rtp` implements each method
//! of `FloatTensorOps`, `IntTensorOps`, `BoolTensorOps`, `ModuleOps`, `ActivationOps`,
//! `QTensorOps` and `TransactionOps`, defaults included, or this file names it as composed on
//! purpose, with the reason. A default that NdArray or Flex implements may never be composed:
//! Burn's default would run past the inner backend's own kernel (slower, and for `float_prod`
//! wrong: `exp(sum(log x))` is NaN for negative values).
//!
//! The check reads the traits' sources (burn-backend 0.21.0, in cargo's registry), so a method
//! that a new Burn adds fails here until it is forwarded or listed below.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Defaults that stay Burn's compositions on purpose, and why.
const COMPOSED: &[(&str, &str)] = &[
    (
        "float_detach",
        "autodiff sits above the decorator: below it nothing tracks gradients, so identity is right",
    ),
    ("float_set_require_grad", "as float_detach"),
    ("float_is_require_grad", "as float_detach"),
    ("q_detach", "as float_detach"),
    ("q_set_require_grad", "as float_detach"),
    ("q_is_require_grad", "as float_detach"),
    (
        "tr_execute",
        "each read goes through our into_data ops, which gather shards; no CPU backend batches",
    ),
];

/// Quantized defaults (`q_…`) that no CPU inner backend implements are composed on purpose:
/// they dequantize through the inner backend, run our float ops and quantize again, which is
/// what the inner backends do themselves (see `ops/qtensor.rs`).
const QUANTIZED_PREFIX: &str = "q_";

const TRAIT_FILES: &[&str] = &[
    "src/backend/ops/tensor.rs",
    "src/backend/ops/int_tensor.rs",
    "src/backend/ops/bool_tensor.rs",
    "src/backend/ops/activation.rs",
    "src/backend/ops/qtensor.rs",
    "src/backend/ops/transaction.rs",
    "src/backend/ops/modules/base.rs",
];

/// The folder of `crate_dir` (e.g. `burn-backend-0.21.0`) in cargo's registry sources.
fn registry_crate(crate_dir: &str) -> PathBuf {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cargo"));
    let src = home.join("registry").join("src");
    let found = std::fs::read_dir(&src)
        .unwrap_or_else(|e| panic!("cargo's registry sources at {}: {e}", src.display()))
        .filter_map(|e| e.ok())
        .map(|e| e.path().join(crate_dir))
        .find(|p| p.is_dir());
    found.unwrap_or_else(|| panic!("{crate_dir} is not in {}", src.display()))
}

/// The source with comments removed (line comments, doc comments and block comments).
fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find('/') {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if tail.starts_with("//") {
            rest = tail.find('\n').map_or("", |n| &tail[n..]);
        } else if tail.starts_with("/*") {
            rest = tail.find("*/").map_or("", |n| &tail[n + 2..]);
        } else {
            out.push('/');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    out
}

/// The methods of every `pub trait … {}` in `text`: (name, has a default body).
fn trait_methods(text: &str) -> Vec<(String, bool)> {
    let text = strip_comments(text);
    let mut methods = Vec::new();
    let mut search = 0;
    while let Some(at) = text[search..].find("pub trait ") {
        let start = search + at;
        let open = start + text[start..].find('{').expect("trait body");
        // The trait body ends at its matching brace.
        let (mut depth, mut end) = (0usize, open);
        for (i, c) in text[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + i;
                        break;
                    }
                }
                _ => {}
            }
        }
        let body = &text[open + 1..end];
        // Items at the body's top level: `fn name`, then the first `;` or `{` outside
        // brackets says whether it is required or has a default.
        let (mut depth, mut i) = (0usize, 0);
        let bytes = body.as_bytes();
        while i < body.len() {
            match bytes[i] {
                b'{' => depth += 1,
                b'}' => depth -= 1,
                b'f' if depth == 0
                    && body[i..].starts_with("fn ")
                    && (i == 0 || !bytes[i - 1].is_ascii_alphanumeric()) =>
                {
                    let name: String = body[i + 3..]
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    let mut nest = 0i32;
                    let mut j = i + 3;
                    let default = loop {
                        match bytes[j] {
                            b'(' | b'[' => nest += 1,
                            b')' | b']' => nest -= 1,
                            b';' if nest == 0 => break false,
                            b'{' if nest == 0 => break true,
                            _ => {}
                        }
                        j += 1;
                    };
                    methods.push((name, default));
                    i = j;
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
        search = end;
    }
    methods
}

/// The text of every `.rs` file under `dir`, comments removed.
fn rust_sources(dir: &Path) -> Vec<String> {
    let mut texts = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("source folder").flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                texts.push(strip_comments(
                    &std::fs::read_to_string(&path).expect("source"),
                ));
            }
        }
    }
    texts
}

/// Every identifier in the `.rs` files under `dir` that is not a path's tail (`B::name`,
/// `Self::name`): method names our impls define, directly or through a macro's list.
fn defined_names(dir: &Path) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for text in rust_sources(dir) {
        let mut word = String::new();
        let mut after_path = false;
        let mut prev = ' ';
        for c in text.chars().chain(std::iter::once(' ')) {
            if c.is_alphanumeric() || c == '_' {
                if word.is_empty() {
                    after_path = prev == ':' || prev == '.';
                }
                word.push(c);
            } else if !word.is_empty() {
                if !after_path {
                    names.insert(std::mem::take(&mut word));
                }
                word.clear();
            }
            prev = c;
        }
    }
    names
}

/// Names defined with `fn name` in the `.rs` files under `dir` (an inner backend's overrides).
fn fn_names(dir: &Path) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for text in rust_sources(dir) {
        for part in text.split("fn ").skip(1) {
            let name: String = part
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            names.insert(name);
        }
    }
    names
}

#[test]
fn every_backend_trait_method_is_forwarded_or_composed_on_purpose() {
    let backend = registry_crate("burn-backend-0.21.0");
    let mut methods = Vec::new();
    for file in TRAIT_FILES {
        let text = std::fs::read_to_string(backend.join(file))
            .unwrap_or_else(|e| panic!("{file} of burn-backend: {e}"));
        methods.extend(trait_methods(&text));
    }
    assert!(
        methods.len() > 400,
        "read only {} trait methods: the parser or Burn's layout changed",
        methods.len()
    );
    let ours = defined_names(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src/backend/ops"));
    let mut inner = fn_names(&registry_crate("burn-ndarray-0.21.0").join("src"));
    inner.extend(fn_names(&registry_crate("burn-flex-0.21.0").join("src")));
    let on_purpose: BTreeSet<&str> = COMPOSED.iter().map(|(name, _)| *name).collect();

    let mut missing = Vec::new();
    let mut wrongly_composed = Vec::new();
    for (name, default) in &methods {
        let composed = on_purpose.contains(name.as_str())
            || (*default && name.starts_with(QUANTIZED_PREFIX) && !inner.contains(name));
        if ours.contains(name) {
            continue;
        }
        if !composed {
            missing.push(format!(
                "{name}{}",
                if *default { "" } else { " (required)" }
            ));
        } else if inner.contains(name) && !on_purpose.contains(name.as_str()) {
            wrongly_composed.push(name.clone());
        }
    }
    assert!(
        missing.is_empty(),
        "backend ops that Rtp neither forwards nor composes on purpose: {missing:?}"
    );
    assert!(
        wrongly_composed.is_empty(),
        "composed although an inner backend implements them: {wrongly_composed:?}"
    );
    // The list stays honest: each entry is a real default that we do not override.
    for (name, why) in COMPOSED {
        assert!(
            methods.iter().any(|(m, d)| m == name && *d),
            "{name} ({why}) is not a default method of Burn's backend traits"
        );
        assert!(
            !ours.contains(*name),
            "{name} is listed as composed but Rtp implements it"
        );
    }
}

/// The parser itself: a required method, a default one, and brackets with `;` inside.
#[test]
fn trait_parser_tells_required_from_default() {
    let text = "pub trait T<B> {\n    /// doc { \n    fn a(x: [usize; 2]) -> u8;\n    fn b() -> u8 { 1 }\n    // fn c();\n}";
    assert_eq!(
        trait_methods(text),
        vec![("a".to_string(), false), ("b".to_string(), true)]
    );
}
