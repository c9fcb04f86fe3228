//! Each crate's modules depend on each other one way only: every module imports only modules
//! of a lower layer, so there is no import cycle and a newcomer can read a crate bottom-up.
//!
//! The check reads `src/` itself. In burn-rtp the folders are the layers (`state/`, `comm/`,
//! `backend/`, `runtime/`, `tools/`), and each file or sub-folder directly inside one of them
//! is a module of the map (`comm::p2p`, `comm::transport`); elsewhere each top-level file or
//! folder is one. For each module the check collects the paths its code names, comments left
//! out: `crate::…` paths (grouped ones included) and `super::…` paths, resolved. A name the
//! crate root re-exports (`crate::RtpError`, `pub use error::RtpError` in `lib.rs`) counts as
//! a use of the module it comes from. burn-rtp-kernels, beside this crate, is checked the
//! same way; the workspace's other crates with modules (the benches, the GPT library) are
//! checked for import cycles.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// burn-rtp's layers, lowest first. A module may use modules of lower layers only. The
/// folders' modules are contiguous, in the order `state`, `comm`, `backend`, `runtime`,
/// `tools` (checked below).
const LAYERS: &[&[&str]] = &[
    // Plain data: errors, then the configuration.
    &["error"],
    &["config"],
    // state/: what one rank counts and stores, with no communication.
    &["state::accounting", "state::timeline", "state::shard_io"],
    &["state::sharding"],
    // comm/: moving tensors between ranks. The ring's indices, the transports and the
    // background worker; a tensor's bytes read in place; the communication context;
    // exchanges; the rotation and routing schedules; the collectives, made of rotation's two
    // halves (see `comm/mod.rs`).
    &["comm::ring", "comm::transport", "comm::background"],
    &["comm::host_view", "comm::context"],
    &["comm::p2p"],
    &["comm::rotation", "comm::route"],
    &["comm::collectives"],
    // backend/: the Linear pairing records, the kept gathers, and the strategies (one type
    // each for DDP, FSDP and RTP, with DDP's buckets and FSDP's prefetch); the rank's
    // op-level state around its `Comm` and its strategy, the tensor primitive, the device,
    // the backend type, and its ops.
    &["backend::pairing", "backend::gathers", "backend::strategy"],
    &["backend::rank"],
    &["backend::tensor"],
    &["backend::device"],
    &["backend::rtp"],
    &["backend::ops"],
    // runtime/: the optimizer wrapper; starting worlds.
    &["runtime::optim"],
    &["runtime::adam"],
    &["runtime::launch"],
    // tools/: the planner, consolidation, checkpoints, the placement report.
    &[
        "tools::plan",
        "tools::consolidate",
        "tools::checkpoint",
        "tools::placement",
    ],
];

/// burn-rtp's layer folders, lowest first.
const FOLDERS: &[&str] = &["state", "comm", "backend", "runtime", "tools"];

/// burn-rtp-kernels' layers, lowest first.
const KERNEL_LAYERS: &[&[&str]] = &[
    // The process-wide switch and launch counters; column windows; a packed input; Adam's
    // scalars.
    &["switches", "columns", "packing", "adam_step"],
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

/// A path as its segments (`["comm", "p2p", "exchange"]`).
type ModPath = Vec<String>;

/// Parses the use tree at the start of `text` (`a::b`, `a::{b, c::{d, self}}`, `a::b as c`,
/// `a::*`) into its paths; returns them and the bytes the tree took.
fn use_tree(text: &str) -> (Vec<ModPath>, usize) {
    let mut prefix = ModPath::new();
    let mut i = 0;
    loop {
        i += text[i..].len() - text[i..].trim_start().len();
        if text[i..].starts_with('{') {
            i += 1;
            let mut paths = Vec::new();
            loop {
                let rest = &text[i..];
                let skipped = rest.trim_start_matches(|c: char| c.is_whitespace() || c == ',');
                i += rest.len() - skipped.len();
                if skipped.is_empty() {
                    return (paths, i);
                }
                if skipped.starts_with('}') {
                    return (paths, i + 1);
                }
                let (inner, used) = use_tree(skipped);
                if used == 0 {
                    return (paths, i);
                }
                i += used;
                for tail in inner {
                    let mut path = prefix.clone();
                    if tail != ["self"] {
                        path.extend(tail);
                    }
                    paths.push(path);
                }
            }
        }
        let id = ident_at(&text[i..]);
        i += id.len();
        let named = !id.is_empty();
        if named {
            prefix.push(id);
        }
        if named && text[i..].starts_with("::") {
            i += 2;
            continue;
        }
        // A rename (`a::b as c`) names `a::b`.
        let rest = text[i..].trim_start();
        if let Some(alias) = rest.strip_prefix("as ") {
            let alias = alias.trim_start();
            i = text.len() - alias.len() + ident_at(alias).len();
        }
        return (vec![prefix], i);
    }
}

/// For each byte of `code`, how many inline `mod name { … }` blocks enclose it (in a test
/// module, `super::` is the file's own module).
fn inline_mod_depths(code: &str) -> Vec<usize> {
    let mut depths = vec![0; code.len() + 1];
    let mut braces = 0usize;
    let mut open_mods: Vec<usize> = Vec::new();
    for (i, c) in code.char_indices() {
        match c {
            '{' => {
                braces += 1;
                let before = code[..i].trim_end();
                let line = &before[before.rfind('\n').map_or(0, |n| n + 1)..];
                let words: Vec<&str> = line.split_whitespace().collect();
                if words.len() >= 2 && words[words.len() - 2] == "mod" {
                    open_mods.push(braces);
                }
            }
            '}' => {
                if open_mods.last() == Some(&braces) {
                    open_mods.pop();
                }
                braces = braces.saturating_sub(1);
            }
            _ => {}
        }
        depths[i] = open_mods.len();
    }
    depths
}

/// Whether the path at byte `i` continues a longer path or name (`x::crate`, `$crate::`).
fn continues_a_path(code: &str, i: usize) -> bool {
    code[..i]
        .chars()
        .next_back()
        .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':' || c == '$')
}

/// The crate paths `source` names, resolved from the file's module `here`: `crate::…`,
/// `super::…` and `self::…` paths, grouped ones expanded; comments left out.
fn named_paths(source: &str, here: &[String]) -> Vec<ModPath> {
    let code = strip_comments(source);
    let depths = inline_mod_depths(&code);
    let mut found = Vec::new();
    for (i, _) in code.match_indices("crate::") {
        if !continues_a_path(&code, i) {
            found.extend(use_tree(&code[i + "crate::".len()..]).0);
        }
    }
    for (i, _) in code.match_indices("super::") {
        if continues_a_path(&code, i) {
            continue;
        }
        let mut rest = &code[i..];
        let mut up = 0usize;
        while let Some(r) = rest.strip_prefix("super::") {
            up += 1;
            rest = r;
        }
        // Inside an inline module the first `super` steps back to this file's module.
        let Some(up) = up.checked_sub(depths[i]).filter(|&up| up > 0) else {
            continue;
        };
        let base = &here[..here.len().saturating_sub(up)];
        for tail in use_tree(rest).0 {
            found.push(base.iter().cloned().chain(tail).collect());
        }
    }
    for (i, _) in code.match_indices("self::") {
        if !continues_a_path(&code, i) && depths[i] == 0 {
            for tail in use_tree(&code[i + "self::".len()..]).0 {
                found.push(here.iter().cloned().chain(tail).collect());
            }
        }
    }
    found.retain(|p| !p.is_empty());
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

/// The crate root's re-exports: each re-exported name and the path it comes from
/// (`pub use error::{RtpError, RtpResult};` maps both names to `error::…`).
fn root_reexports(lib: &str) -> BTreeMap<String, ModPath> {
    let code = strip_comments(lib);
    let mut names = BTreeMap::new();
    for statement in code.split(';') {
        let Some(tree) = statement.trim().strip_prefix("pub use ") else {
            continue;
        };
        for path in use_tree(tree).0 {
            if let Some(name) = path.last() {
                names.insert(name.clone(), path.clone());
            }
        }
    }
    names
}

/// The module path of a source file (`comm/transport/mpi/wire.rs` is `comm::transport::mpi::wire`,
/// a folder's `mod.rs` is the folder).
fn module_path(rel: &Path) -> ModPath {
    let mut path: ModPath = rel
        .components()
        .map(|c| {
            c.as_os_str()
                .to_string_lossy()
                .trim_end_matches(".rs")
                .to_string()
        })
        .collect();
    if path.last().is_some_and(|l| l == "mod" || l == "lib") {
        path.pop();
    }
    path
}

/// The layer folders of a table: those named before `::` in its entries.
fn folders_of(layers: &[&[&str]]) -> BTreeSet<String> {
    layers
        .iter()
        .flat_map(|l| l.iter())
        .filter_map(|m| m.split_once("::").map(|(f, _)| f.to_string()))
        .collect()
}

/// The module of the map that `path` lies in: in a layer folder the folder and the next
/// segment (`comm::p2p`), elsewhere the first segment.
fn node_of(path: &[String], folders: &BTreeSet<String>) -> String {
    match path {
        [folder, module, ..] if folders.contains(folder) => format!("{folder}::{module}"),
        [first, ..] => first.clone(),
        [] => String::new(),
    }
}

/// Each module of the map of the crate whose sources are in `src` and the modules it names,
/// directly, through `super::` or through the root's re-exports. A layer folder's `mod.rs`
/// may name its own modules (it declares them); anything else it names is an edge of the
/// folder itself, which no table lists.
fn module_graph_of(src: &Path, layers: &[&[&str]]) -> BTreeMap<String, BTreeSet<String>> {
    let folders = folders_of(layers);
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let reexports = root_reexports(&std::fs::read_to_string(src.join("lib.rs")).unwrap());
    let sources: Vec<(ModPath, String)> = files
        .iter()
        .map(|f| (module_path(f.strip_prefix(src).unwrap()), f.clone()))
        .filter(|(here, _)| !here.is_empty())
        .map(|(here, f)| (here, std::fs::read_to_string(f).unwrap()))
        .collect();
    let modules: BTreeSet<String> = sources
        .iter()
        .map(|(here, _)| node_of(here, &folders))
        .collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (here, source) in &sources {
        let node = node_of(here, &folders);
        let folder_root = here.len() == 1 && folders.contains(&here[0]);
        if !folder_root {
            graph.entry(node.clone()).or_default();
        }
        for path in named_paths(source, here) {
            let path: ModPath = match reexports.get(&path[0]) {
                Some(origin) => origin.iter().chain(&path[1..]).cloned().collect(),
                None => path,
            };
            if folder_root && path.len() > 1 && path[0] == here[0] {
                continue;
            }
            let mut dep = node_of(&path, &folders);
            // An item a folder's `mod.rs` defines is a use of the folder itself.
            if !modules.contains(&dep) && folders.contains(&path[0]) {
                dep = path[0].clone();
            }
            if dep != node && modules.contains(&dep) {
                graph.entry(node.clone()).or_default().insert(dep);
            }
        }
    }
    graph
}

/// burn-rtp's module graph.
fn module_graph() -> BTreeMap<String, BTreeSet<String>> {
    module_graph_of(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), LAYERS)
}

/// burn-rtp-kernels' module graph.
fn kernel_module_graph() -> BTreeMap<String, BTreeSet<String>> {
    module_graph_of(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../burn-rtp-kernels/src"),
        KERNEL_LAYERS,
    )
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

/// The workspace's other crates with modules have no layer table, and no import cycle
/// either: each top-level file or folder of their `src/` is one module. (The Learner is a
/// library file and a binary, with no modules.)
#[test]
fn no_other_crate_of_the_workspace_has_an_import_cycle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for src in ["benches/src", "examples/src"] {
        let graph = module_graph_of(&root.join(src), &[]);
        assert!(graph.len() >= 3, "{src}: found too few modules: {graph:?}");
        assert_acyclic(&graph);
    }
}

#[test]
fn the_parser_sees_grouped_nested_and_plain_paths_but_not_comments() {
    let source = "use crate::a::X;\nuse crate::{b::Y, c::{d, self}};\n// crate::z\n\
                  let x = crate::e::f();\nuse crate::g::h as i;\nlet y = $crate::k::l;";
    let found = named_paths(source, &["m".to_string()]);
    let found: Vec<String> = found.iter().map(|p| p.join("::")).collect();
    assert_eq!(found, ["a::X", "b::Y", "c::d", "c", "e::f", "g::h"]);
}

#[test]
fn super_paths_resolve_from_the_file_and_from_inline_modules() {
    let here = ["comm".to_string(), "rotation".to_string()];
    let source = "use super::p2p::{exchange, Leg};\nuse super::super::error::E;\n\
                  mod tests {\n    use super::*;\n    use super::super::ring::Ring;\n}\n";
    let found: Vec<String> = named_paths(source, &here)
        .iter()
        .map(|p| p.join("::"))
        .collect();
    // In `mod tests`, `super` is `comm::rotation` itself and `super::super` is `comm`.
    assert_eq!(
        found,
        [
            "comm::p2p::exchange",
            "comm::p2p::Leg",
            "error::E",
            "comm::ring::Ring"
        ]
    );
}

#[test]
fn uses_through_root_reexports_count_as_uses_of_their_module() {
    let lib = "pub use error::{RtpError, RtpResult};\npub use backend::rtp::Rtp;\n\
               pub use comm::{rotation, transport};\n// pub use x::Y;";
    let names = root_reexports(lib);
    let folders: BTreeSet<String> = ["comm", "backend"].map(String::from).into();
    let node = |name: &str| node_of(&names[name], &folders);
    assert_eq!(node("RtpError"), "error");
    assert_eq!(node("RtpResult"), "error");
    assert_eq!(node("Rtp"), "backend::rtp");
    assert_eq!(node("transport"), "comm::transport");
    assert!(!names.contains_key("Y"));
}

/// The folders are layers: each one's modules sit in consecutive layers, the folders in the
/// order of `FOLDERS`, and every module of a folder is in the table.
#[test]
fn the_folders_are_layers_in_order() {
    let folder_of = |m: &str| m.split_once("::").map(|(f, _)| f.to_string());
    let order: Vec<String> = LAYERS
        .iter()
        .flat_map(|layer| {
            let folders: BTreeSet<Option<String>> = layer.iter().map(|m| folder_of(m)).collect();
            assert_eq!(folders.len(), 1, "a layer mixes folders: {layer:?}");
            folders
        })
        .flatten()
        .collect();
    let mut runs = order.clone();
    runs.dedup();
    assert_eq!(
        runs, FOLDERS,
        "each folder's layers are consecutive, in order"
    );
    let graph = module_graph();
    for folder in FOLDERS {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("src")
            .join(folder);
        assert!(dir.is_dir(), "layer folder {folder}/ is missing");
        assert!(graph.keys().any(|m| m.starts_with(&format!("{folder}::"))));
    }
}

/// Every module `from` reaches through any chain of uses.
fn reachable(graph: &BTreeMap<String, BTreeSet<String>>, from: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![from.to_string()];
    while let Some(m) = todo.pop() {
        for dep in graph.get(&m).into_iter().flatten() {
            if seen.insert(dep.clone()) {
                todo.push(dep.clone());
            }
        }
    }
    seen
}

/// The communication layers cannot reach the backend's op-level state (the Linear pairing,
/// the rank context that holds it): they take a `Comm`, which holds none of it.
#[test]
fn the_pairing_state_is_out_of_reach_of_the_communication_layers() {
    let graph = module_graph();
    for module in [
        "comm::p2p",
        "comm::rotation",
        "comm::collectives",
        "comm::context",
    ] {
        assert!(graph.contains_key(module), "no module {module}");
        let reached = reachable(&graph, module);
        for op_state in ["backend::pairing", "backend::rank", "backend::tensor"] {
            assert!(
                !reached.contains(op_state),
                "{module} reaches {op_state}: {reached:?}"
            );
        }
        assert!(reached.iter().all(|m| !m.starts_with("backend::")));
    }
    // The check could fail: the op layer does reach the pairing state.
    assert!(reachable(&graph, "backend::ops").contains("backend::pairing"));
}

/// `docs/architecture.md` quotes the table above word for word, so the map a reader sees is
/// the one this test enforces.
#[test]
fn the_architecture_doc_quotes_this_table() {
    let this = include_str!("layering.rs");
    let start = this.find("/// burn-rtp's layers, lowest first.").unwrap();
    let end = this.find("/// burn-rtp's layer folders").unwrap();
    let table = this[start..end].trim_end();
    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/architecture.md"),
    )
    .unwrap();
    assert!(
        doc.contains(table),
        "docs/architecture.md does not quote tests/layering.rs' LAYERS: copy it over"
    );
}
