//! Each crate's modules depend on each other one way only: every module imports only modules
//! of a lower layer, so there is no import cycle and a newcomer can read a crate bottom-up.
//!
//! The check reads `src/` itself: for each top-level module (a file or a folder) it collects
//! the `crate::name` paths its code names, comments left out. A name the crate root
//! re-exports (`crate::RtpError`, `pub use error::RtpError` in `lib.rs`) counts as a use of
//! the module it comes from. burn-rtp-kernels, beside this crate, is checked the same way.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, lowest first. A module may use modules of lower layers only.
const LAYERS: &[&[&str]] = &[
    // Plain data and arithmetic: errors, the ring's indices, the timeline.
    &["error", "ring", "timeline"],
    // What is counted and what is stored: the ledger (and the byte count), shard files.
    &["accounting", "shard_io"],
    // Configuration.
    &["config"],
    // The placement policy; moving bytes.
    &["sharding", "transport"],
    // A tensor's bytes read in place for a byte transport.
    &["host_view"],
    // The Linear forward records a backward pairs with.
    &["linear_pairing"],
    // One rank's state.
    &["world"],
    // The tensor primitive; point-to-point exchanges.
    &["tensor", "p2p"],
    // The rotation schedule.
    &["rotation"],
    // Collectives (all-gather, all-reduce, reduce-scatter).
    &["collectives"],
    // The device users hold; the backend type.
    &["device"],
    &["backend"],
    // The backend's ops and the optimizer wrapper.
    &["ops", "optim"],
    // Starting worlds.
    &["launch"],
    // Tools on top: the planner, consolidation, checkpoints, the placement report.
    &["plan", "consolidate", "checkpoint", "placement"],
];

/// burn-rtp-kernels' layers, lowest first.
const KERNEL_LAYERS: &[&[&str]] = &[
    // The process-wide switch and launch counters; column windows; a packed input.
    &["switches", "columns", "packing"],
    // The compositions of Burn ops every backend can run.
    &["generic"],
    // The interface a backend implements, and the proof of checked operands.
    &["dispatch"],
    // The kernels, their checked entry points and each backend's implementation.
    &["kernel"],
];

/// Strips `//` comments (doc comments included), keeping string contents as they are.
fn strip_comments(source: &str) -> String {
    source
        .lines()
        .map(|line| match line.find("//") {
            Some(i) if !line[..i].contains('"') => &line[..i],
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn ident_at(text: &str) -> String {
    text.chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

/// The crate modules named by `crate::...` paths, including `crate::{a, b::c}` groups.
fn named_modules(source: &str) -> BTreeSet<String> {
    let code = strip_comments(source);
    let mut found = BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                found.insert(ident_at(item.trim()));
            }
        } else {
            found.insert(ident_at(rest));
        }
    }
    found.retain(|m| !m.is_empty());
    found
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The crate root's re-exports: each re-exported name and the module it comes from
/// (`pub use error::{RtpError, RtpResult};` maps both names to `error`).
fn root_reexports(lib: &str) -> BTreeMap<String, String> {
    let code = strip_comments(lib);
    let mut names = BTreeMap::new();
    for statement in code.split(';') {
        let Some(path) = statement.trim().strip_prefix("pub use ") else {
            continue;
        };
        let module = ident_at(path);
        let rest = &path[module.len()..];
        let items: Vec<&str> = match (rest.find('{'), rest.rfind('}')) {
            (Some(a), Some(b)) => rest[a + 1..b].split(',').collect(),
            _ => vec![rest.rsplit("::").next().unwrap_or("")],
        };
        for item in items {
            let name = item.trim().rsplit("::").next().unwrap_or("");
            let name = name.split(" as ").last().unwrap_or("").trim();
            if !name.is_empty() {
                names.insert(name.to_string(), module.clone());
            }
        }
    }
    names
}

/// Each top-level module of the crate whose sources are in `src` and the crate modules it
/// names, directly or through the root's re-exports.
fn module_graph_of(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let reexports = root_reexports(&std::fs::read_to_string(src.join("lib.rs")).unwrap());
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let rel = file.strip_prefix(src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let module = first.trim_end_matches(".rs").to_string();
        if module == "lib" {
            continue;
        }
        let names = named_modules(&std::fs::read_to_string(&file).unwrap())
            .into_iter()
            .map(|name| reexports.get(&name).cloned().unwrap_or(name));
        graph.entry(module).or_default().extend(names);
    }
    let modules: BTreeSet<String> = graph.keys().cloned().collect();
    for (module, deps) in graph.iter_mut() {
        deps.retain(|d| modules.contains(d) && d != module);
    }
    graph
}

/// burn-rtp's module graph.
fn module_graph() -> BTreeMap<String, BTreeSet<String>> {
    module_graph_of(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))
}

/// burn-rtp-kernels' module graph.
fn kernel_module_graph() -> BTreeMap<String, BTreeSet<String>> {
    module_graph_of(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../burn-rtp-kernels/src"))
}

fn layer_of(layers: &[&[&str]], module: &str) -> Option<usize> {
    layers.iter().position(|layer| layer.contains(&module))
}

/// Every way `graph` breaks `layers`, in words.
fn layering_errors(graph: &BTreeMap<String, BTreeSet<String>>, layers: &[&[&str]]) -> Vec<String> {
    let mut wrong = Vec::new();
    for (module, deps) in graph {
        let Some(own) = layer_of(layers, module) else {
            wrong.push(format!(
                "module `{module}` is in no layer: add it to the table"
            ));
            continue;
        };
        for dep in deps {
            match layer_of(layers, dep) {
                Some(layer) if layer < own => {}
                _ => wrong.push(format!("`{module}` (layer {own}) uses `{dep}`")),
            }
        }
    }
    wrong
}

#[test]
fn every_module_imports_only_lower_layers() {
    let graph = module_graph();
    assert!(graph.len() > 10, "found too few modules: {graph:?}");
    let wrong = layering_errors(&graph, LAYERS);
    assert!(wrong.is_empty(), "layering broken:\n{}", wrong.join("\n"));
}

#[test]
fn every_kernel_module_imports_only_lower_layers() {
    let graph = kernel_module_graph();
    assert!(graph.len() >= 5, "found too few modules: {graph:?}");
    let wrong = layering_errors(&graph, KERNEL_LAYERS);
    assert!(
        wrong.is_empty(),
        "burn-rtp-kernels' layering broken:\n{}",
        wrong.join("\n")
    );
}

/// Panics on an import cycle in `graph`: a depth-first search for a back edge, independent
/// of any layer table.
fn assert_acyclic(graph: &BTreeMap<String, BTreeSet<String>>) {
    fn visit<'a>(
        module: &'a str,
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) {
        if let Some(start) = path.iter().position(|m| *m == module) {
            panic!("import cycle: {} -> {module}", path[start..].join(" -> "));
        }
        if !done.insert(module) {
            return;
        }
        path.push(module);
        for dep in &graph[module] {
            visit(dep, graph, path, done);
        }
        path.pop();
    }
    let mut done = BTreeSet::new();
    for module in graph.keys() {
        visit(module, graph, &mut Vec::new(), &mut done);
    }
}

#[test]
fn there_is_no_import_cycle() {
    assert_acyclic(&module_graph());
    assert_acyclic(&kernel_module_graph());
}

#[test]
fn the_parser_sees_grouped_and_plain_paths_but_not_comments() {
    let source = "use crate::a::X;\nuse crate::{b::Y, c};\n// crate::d\nlet x = crate::e::f();";
    let found: Vec<String> = named_modules(source).into_iter().collect();
    assert_eq!(found, ["a", "b", "c", "e"]);
}

#[test]
fn uses_through_root_reexports_count_as_uses_of_their_module() {
    let lib = "pub use error::{RtpError, RtpResult};\npub use backend::Rtp;\n// pub use x::Y;";
    let names = root_reexports(lib);
    assert_eq!(names["RtpError"], "error");
    assert_eq!(names["RtpResult"], "error");
    assert_eq!(names["Rtp"], "backend");
    assert!(!names.contains_key("Y"));
}
