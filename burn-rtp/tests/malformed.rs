//! Property-based campaigns against malformed checkpoints: many damaged manifests and shard
//! files, each opened and loaded the way a resume does. Every input must give a typed error,
//! or load exactly the values that were saved: no panic escapes, no wrong value is accepted.
//!
//! Two targets, each a seeded proptest campaign:
//!
//! * **manifest**: random bytes, a truncated manifest, and the valid manifest with one node
//!   replaced (numbers near `u64::MAX`, negative or fractional numbers, strings such as
//!   `../x`, nulls, empty lists) or removed;
//! * **shard files**: the model's record file truncated, extended or with bytes flipped under
//!   the manifest's checksum, and record files changed in their structure (shapes, dtypes,
//!   lengths, names) and written with a matching size and checksum, as a buggy writer would.
//!
//! `PROPTEST_CASES` sets the inputs per target (256 by default; the local campaign in
//! `docs/testing.md` ran 100,000). Each campaign prints its count and how the inputs ended.

mod common;

use burn::backend::{Autodiff, NdArray};
use burn::module::Module;
use burn::optim::{GradientsParams, Optimizer};
use burn::record::{FullPrecisionSettings, NamedMpkBytesRecorder, Recorder};
use burn::tensor::{Int, Tensor, TensorData};
use burn_rtp::checkpoint::{self, fnv1a64, Checkpoint};
use burn_rtp::{launch, Rtp, RtpConfig, RtpDevice, RtpOptimizer};
use common::*;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use std::path::{Path, PathBuf};

type Dist = Autodiff<Rtp<NdArray>>;
type Model = TinyLm<Dist>;

/// A fresh folder for one campaign, removed when it passes.
struct Work(PathBuf);

impl std::ops::Deref for Work {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn temp_dir(name: &str) -> Work {
    let dir = std::env::temp_dir().join(format!("burn-rtp-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    Work(dir)
}

/// Inputs per target.
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(256)
}

/// A seeded runner, so that CI tries the same inputs every time.
fn runner(seed: u8) -> TestRunner {
    let config = Config {
        cases: cases(),
        failure_persistence: None,
        max_shrink_iters: 256,
        ..Config::default()
    };
    TestRunner::new_with_rng(
        config,
        TestRng::from_seed(RngAlgorithm::ChaCha, &[seed; 32]),
    )
}

fn model(device: &RtpDevice<NdArray>) -> Model {
    TinyLm::sized(12, 20, 1, device)
}

/// A checkpoint of a model trained two steps (so the optimizer has state), its folder, and
/// what was saved: each parameter's shape and values, and the optimizer's record bytes.
struct Saved {
    dir: PathBuf,
    params: Vec<(Vec<usize>, Vec<f32>)>,
    optim: Vec<u8>,
}

fn params(m: &Model) -> Vec<(Vec<usize>, Vec<f32>)> {
    params_of(m)
}

/// Each float parameter's shape and values, on any backend.
fn params_of<B: burn::tensor::backend::Backend, M: Module<B>>(
    m: &M,
) -> Vec<(Vec<usize>, Vec<f32>)> {
    use burn::module::{ModuleVisitor, Param};
    struct Collect(Vec<(Vec<usize>, Vec<f32>)>);
    impl<B: burn::tensor::backend::Backend> ModuleVisitor<B> for Collect {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let data = param.val().into_data();
            self.0.push((
                data.shape.to_vec(),
                data.convert::<f32>().to_vec::<f32>().unwrap(),
            ));
        }
    }
    let mut c = Collect(Vec::new());
    m.visit(&mut c);
    c.0
}

/// The optimizer's record, with every map's entries in key order: the record keeps its
/// per-parameter state in a hash map, whose order differs from one record to the next.
fn optim_bytes<O: Optimizer<Model, Dist>>(o: &O) -> Vec<u8> {
    fn sorted(value: rmpv::Value) -> rmpv::Value {
        match value {
            rmpv::Value::Map(pairs) => {
                let mut pairs: Vec<(rmpv::Value, rmpv::Value)> = pairs
                    .into_iter()
                    .map(|(k, v)| (sorted(k), sorted(v)))
                    .collect();
                pairs.sort_by_key(|(k, _)| k.to_string());
                rmpv::Value::Map(pairs)
            }
            rmpv::Value::Array(items) => {
                rmpv::Value::Array(items.into_iter().map(sorted).collect())
            }
            other => other,
        }
    }
    let bytes = Recorder::<Dist>::record(
        &NamedMpkBytesRecorder::<FullPrecisionSettings>::default(),
        o.to_record(),
        (),
    )
    .unwrap();
    let value = sorted(rmpv::decode::read_value(&mut &bytes[..]).unwrap());
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &value).unwrap();
    out
}

fn save_one(device: &RtpDevice<NdArray>, root: &Path) -> Saved {
    let mut m = model(device);
    let mut optim = RtpOptimizer::new(adam().init());
    for step in 0..2 {
        let tokens = Tensor::<Dist, 2, Int>::from_data(
            TensorData::new(
                (0..16).map(|i| (i * 7 + step) % 60).collect::<Vec<i64>>(),
                [2, 8],
            ),
            device,
        );
        let targets = Tensor::<Dist, 2, Int>::from_data(
            TensorData::new(
                (0..16).map(|i| (i * 5 + step) % 60).collect::<Vec<i64>>(),
                [2, 8],
            ),
            device,
        );
        let loss = m.loss(tokens, targets);
        let grads = GradientsParams::from_grads(loss.backward(), &m);
        m = optim.step(LR, m, grads);
    }
    let dir = checkpoint::save(device, root, 2, &m, &optim, &()).unwrap();
    Saved {
        dir,
        params: params(&m),
        optim: optim_bytes(&optim),
    }
}

thread_local! {
    /// Whether this thread is inside the library's open, load or consolidation.
    static IN_LIBRARY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Panics raised inside the library's calls (even ones it catches): there must be none.
static LIBRARY_PANICS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Counts the panics raised while `IN_LIBRARY` is set, on top of the hook in place.
fn count_library_panics() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if IN_LIBRARY.with(|f| f.get()) {
            LIBRARY_PANICS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        previous(info);
    }));
}

/// Runs `f` as a call into the library.
fn in_library<T>(f: impl FnOnce() -> T) -> T {
    IN_LIBRARY.with(|flag| flag.set(true));
    let out = f();
    IN_LIBRARY.with(|flag| flag.set(false));
    out
}

/// How an input ended.
#[derive(Default, Debug)]
struct Tally {
    refused: u64,
    loaded_exactly: u64,
}

/// Opens and loads the checkpoint in `dir` as a resume does, and consolidates it as
/// resharding does (on the host, through another path); an error is fine, a load or a
/// consolidation must give back exactly what was saved.
fn open_and_load(
    device: &RtpDevice<NdArray>,
    dir: &Path,
    saved: &Saved,
    tally: &std::cell::RefCell<Tally>,
) -> Result<(), TestCaseError> {
    let consolidated = in_library(|| Checkpoint::open(dir).and_then(|c| c.consolidated_records()));
    if let Ok((model_record, _)) = consolidated {
        // What single-device Burn loads from it: the saved values, or nothing at all.
        if let Some(single) = load_single(&model_record) {
            prop_assert!(
                single == saved.params,
                "a consolidation of other values accepted"
            );
        }
    }
    let loaded = in_library(|| {
        Checkpoint::open(dir).and_then(|c| {
            c.load(
                device,
                model(device),
                RtpOptimizer::new(adam().init::<Dist, Model>()),
            )
        })
    });
    match loaded {
        Err(_) => tally.borrow_mut().refused += 1,
        Ok((m, o)) => {
            prop_assert!(params(&m) == saved.params, "wrong parameters accepted");
            prop_assert!(
                optim_bytes(&o) == saved.optim,
                "a wrong optimizer state accepted"
            );
            tally.borrow_mut().loaded_exactly += 1;
        }
    }
    Ok(())
}

/// The parameters single-device Burn loads from a consolidated model record, or `None` if it
/// refuses it (an error or a panic of Burn's decoder).
fn load_single(record: &[u8]) -> Option<Vec<(Vec<usize>, Vec<f32>)>> {
    type Single = NdArray;
    let device = Default::default();
    let loaded = std::panic::catch_unwind(|| {
        Recorder::<Single>::load::<TinyLmRecord<Single>>(
            &NamedMpkBytesRecorder::<FullPrecisionSettings>::default(),
            record.to_vec(),
            &device,
        )
    });
    let record = loaded.ok()?.ok()?;
    let model = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        TinyLm::<Single>::sized(12, 20, 1, &device).load_record(record)
    }))
    .ok()?;
    Some(params_of(&model))
}

/// Every node of a JSON value, as a JSON pointer.
fn pointers(value: &serde_json::Value, at: String, out: &mut Vec<String>) {
    out.push(at.clone());
    match value {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                pointers(
                    v,
                    format!("{at}/{}", k.replace('~', "~0").replace('/', "~1")),
                    out,
                );
            }
        }
        serde_json::Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                pointers(v, format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
}

/// Values a damaged manifest may hold where a valid one has anything else.
fn odd_json() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::json;
    prop_oneof![
        Just(json!(u64::MAX)),
        Just(json!(u64::MAX - 1)),
        Just(json!(1u64 << 53)),
        any::<u64>().prop_map(|n| json!(n)),
        (0u64..8).prop_map(|n| json!(n)),
        any::<i64>().prop_map(|n| json!(n)),
        Just(json!(-1)),
        Just(json!(0.5)),
        Just(json!(null)),
        Just(json!([])),
        Just(json!({})),
        Just(json!(true)),
        Just(json!("../x")),
        Just(json!("/etc/passwd")),
        Just(json!("")),
        "[a-z0-9_.-]{0,12}".prop_map(|s| json!(s)),
        prop::collection::vec(any::<u32>().prop_map(|n| json!(n)), 0..4).prop_map(|v| json!(v)),
    ]
}

/// One way to damage a manifest.
#[derive(Debug, Clone)]
enum ManifestDamage {
    Bytes(Vec<u8>),
    Truncate(usize),
    Replace(usize, serde_json::Value),
    Remove(usize),
}

fn manifest_damage() -> impl Strategy<Value = ManifestDamage> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..300).prop_map(ManifestDamage::Bytes),
        any::<usize>().prop_map(ManifestDamage::Truncate),
        (any::<usize>(), odd_json()).prop_map(|(i, v)| ManifestDamage::Replace(i, v)),
        (any::<usize>(), odd_json()).prop_map(|(i, v)| ManifestDamage::Replace(i, v)),
        any::<usize>().prop_map(ManifestDamage::Remove),
    ]
}

fn damaged_manifest(valid: &[u8], damage: &ManifestDamage) -> Vec<u8> {
    let value: serde_json::Value = serde_json::from_slice(valid).unwrap();
    let mut nodes = Vec::new();
    pointers(&value, String::new(), &mut nodes);
    match damage {
        ManifestDamage::Bytes(bytes) => bytes.clone(),
        ManifestDamage::Truncate(at) => valid[..at % valid.len()].to_vec(),
        ManifestDamage::Replace(i, new) => {
            let mut value = value;
            let node = &nodes[i % nodes.len()];
            match value.pointer_mut(node) {
                Some(slot) => *slot = new.clone(),
                None => unreachable!("{node} is a node of the value"),
            }
            serde_json::to_vec(&value).unwrap()
        }
        ManifestDamage::Remove(i) => {
            let mut value = value;
            let node = &nodes[1 + i % (nodes.len() - 1)];
            let (parent, key) = node.rsplit_once('/').unwrap();
            match value.pointer_mut(parent).unwrap() {
                serde_json::Value::Object(map) => {
                    map.remove(&key.replace("~1", "/").replace("~0", "~"));
                }
                serde_json::Value::Array(items) => {
                    items.remove(key.parse::<usize>().unwrap());
                }
                _ => unreachable!(),
            }
            serde_json::to_vec(&value).unwrap()
        }
    }
}

/// One way to damage the model's record file. `Structure` edits the MessagePack tree and
/// writes a matching size and checksum into the manifest; the others leave the manifest as
/// it was, so its size or checksum must catch them.
#[derive(Debug, Clone)]
enum FileDamage {
    Truncate(usize),
    Append(Vec<u8>),
    Flip(Vec<(usize, u8)>),
    Structure(usize, StructEdit),
}

#[derive(Debug, Clone)]
enum StructEdit {
    /// Replace an integer by another (a dimension, a length).
    Int(u64),
    /// Replace a string (a dtype name, a field name's value).
    Str(String),
    /// Drop an element of an array (a dimension of a shape).
    DropItem,
    /// Duplicate an array's first element (a shape with one more dimension).
    DupItem,
    /// Cut a byte string short (a tensor's data).
    CutBin(usize),
}

fn file_damage() -> impl Strategy<Value = FileDamage> {
    let edit = prop_oneof![
        prop_oneof![
            Just(0u64),
            Just(1u64),
            Just(u64::MAX),
            Just(u32::MAX as u64 + 1),
            0u64..100
        ]
        .prop_map(StructEdit::Int),
        prop_oneof![
            Just("F64".to_string()),
            Just("I32".to_string()),
            Just("U8".to_string()),
            Just("Bool".to_string()),
            Just("".to_string()),
            "[A-Za-z0-9]{0,6}"
        ]
        .prop_map(StructEdit::Str),
        Just(StructEdit::DropItem),
        Just(StructEdit::DupItem),
        any::<usize>().prop_map(StructEdit::CutBin),
    ];
    prop_oneof![
        any::<usize>().prop_map(FileDamage::Truncate),
        prop::collection::vec(any::<u8>(), 1..64).prop_map(FileDamage::Append),
        prop::collection::vec((any::<usize>(), 1u8..=255), 1..4).prop_map(FileDamage::Flip),
        (any::<usize>(), edit.clone()).prop_map(|(i, e)| FileDamage::Structure(i, e)),
        (any::<usize>(), edit).prop_map(|(i, e)| FileDamage::Structure(i, e)),
    ]
}

/// Every node of a MessagePack tree of the kind an edit applies to, as child-index paths.
fn nodes_of(value: &rmpv::Value, at: Vec<usize>, out: &mut Vec<Vec<usize>>) {
    out.push(at.clone());
    match value {
        rmpv::Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                let mut p = at.clone();
                p.push(i);
                nodes_of(v, p, out);
            }
        }
        rmpv::Value::Map(pairs) => {
            for (i, (_, v)) in pairs.iter().enumerate() {
                let mut p = at.clone();
                p.push(i);
                nodes_of(v, p, out);
            }
        }
        _ => {}
    }
}

fn node_ref<'a>(value: &'a rmpv::Value, path: &[usize]) -> &'a rmpv::Value {
    let Some((&first, rest)) = path.split_first() else {
        return value;
    };
    match value {
        rmpv::Value::Array(items) => node_ref(&items[first], rest),
        rmpv::Value::Map(pairs) => node_ref(&pairs[first].1, rest),
        _ => unreachable!(),
    }
}

fn node_at<'a>(value: &'a mut rmpv::Value, path: &[usize]) -> &'a mut rmpv::Value {
    let Some((&first, rest)) = path.split_first() else {
        return value;
    };
    match value {
        rmpv::Value::Array(items) => node_at(&mut items[first], rest),
        rmpv::Value::Map(pairs) => node_at(&mut pairs[first].1, rest),
        _ => unreachable!(),
    }
}

/// Whether `edit` applies to `node`.
fn applies(edit: &StructEdit, node: &rmpv::Value) -> bool {
    match (edit, node) {
        (StructEdit::Int(_), rmpv::Value::Integer(_)) => true,
        (StructEdit::Str(_), rmpv::Value::String(_)) => true,
        (StructEdit::DropItem | StructEdit::DupItem, rmpv::Value::Array(items)) => {
            !items.is_empty()
        }
        (StructEdit::CutBin(_), rmpv::Value::Binary(bytes)) => !bytes.is_empty(),
        _ => false,
    }
}

/// The record with the `i`-th node that `edit` applies to edited (`None` if none applies).
fn edited(record: &[u8], i: usize, edit: &StructEdit) -> Option<Vec<u8>> {
    let mut value = rmpv::decode::read_value(&mut &record[..]).unwrap();
    let mut nodes = Vec::new();
    nodes_of(&value, Vec::new(), &mut nodes);
    nodes.retain(|path| applies(edit, node_ref(&value, path)));
    if nodes.is_empty() {
        return None;
    }
    let node = node_at(&mut value, &nodes[i % nodes.len()]);
    match (edit, &mut *node) {
        (StructEdit::Int(n), _) => *node = rmpv::Value::from(*n),
        (StructEdit::Str(text), _) => *node = rmpv::Value::from(text.as_str()),
        (StructEdit::DropItem, rmpv::Value::Array(items)) => {
            items.pop();
        }
        (StructEdit::DupItem, rmpv::Value::Array(items)) => {
            let first = items[0].clone();
            items.push(first);
        }
        (StructEdit::CutBin(at), rmpv::Value::Binary(bytes)) => bytes.truncate(at % bytes.len()),
        _ => unreachable!("only nodes the edit applies to are picked"),
    }
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &value).unwrap();
    Some(out)
}

/// Copies the checkpoint folder `from` to a fresh folder `to`.
fn copy_dir(from: &Path, to: &Path) {
    let _ = std::fs::remove_dir_all(to);
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, to.join(path.file_name().unwrap())).unwrap();
    }
}

#[test]
fn damaged_manifests_are_refused_or_load_what_was_saved() {
    let work = temp_dir("malformed-manifest");
    let (tally, n) = launch(RtpConfig::new(1), |device| {
        count_library_panics();
        let saved = save_one(&device, &work.join("root"));
        let valid = std::fs::read(saved.dir.join("manifest.json")).unwrap();
        let dir = work.join("case");
        copy_dir(&saved.dir, &dir);
        let tally = std::cell::RefCell::new(Tally::default());
        let mut runner = runner(1);
        runner
            .run(&manifest_damage(), |damage| {
                std::fs::write(dir.join("manifest.json"), damaged_manifest(&valid, &damage))
                    .unwrap();
                open_and_load(&device, &dir, &saved, &tally)
            })
            .unwrap_or_else(|e| panic!("{e}"));
        (tally.into_inner(), cases())
    })
    .unwrap()
    .remove(0);
    eprintln!(
        "malformed manifests: {n} inputs, {} refused with a typed error, {} loaded exactly \
         what was saved",
        tally.refused, tally.loaded_exactly
    );
    assert_eq!(tally.refused + tally.loaded_exactly, u64::from(n));
    let panics = LIBRARY_PANICS.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(
        panics, 0,
        "the library panicked (and caught it) {panics} times"
    );
    assert!(tally.refused > 0 && tally.loaded_exactly > 0, "{tally:?}");
}

#[test]
fn damaged_shard_files_are_refused_or_load_what_was_saved() {
    let work = temp_dir("malformed-shards");
    let (tally, skipped, n) = launch(RtpConfig::new(1), |device| {
        count_library_panics();
        let saved = save_one(&device, &work.join("root"));
        let name = "rank-00000.model.mpk";
        let valid = std::fs::read(saved.dir.join(name)).unwrap();
        let manifest: serde_json::Value =
            serde_json::from_slice(&std::fs::read(saved.dir.join("manifest.json")).unwrap())
                .unwrap();
        let dir = work.join("case");
        let tally = std::cell::RefCell::new(Tally::default());
        let not_applicable = std::cell::Cell::new(0u64);
        let mut runner = runner(2);
        runner
            .run(&file_damage(), |damage| {
                copy_dir(&saved.dir, &dir);
                let bytes = match &damage {
                    FileDamage::Truncate(at) => valid[..at % valid.len()].to_vec(),
                    FileDamage::Append(extra) => [valid.clone(), extra.clone()].concat(),
                    FileDamage::Flip(flips) => {
                        let mut bytes = valid.clone();
                        for (at, mask) in flips {
                            let i = at % bytes.len();
                            bytes[i] ^= mask;
                        }
                        bytes
                    }
                    FileDamage::Structure(i, edit) => {
                        let Some(bytes) = edited(&valid, *i, edit) else {
                            not_applicable.set(not_applicable.get() + 1);
                            return Ok(());
                        };
                        // A writer that wrote these bytes would have recorded them.
                        let mut m = manifest.clone();
                        let entry = m["files"]
                            .as_array_mut()
                            .unwrap()
                            .iter_mut()
                            .find(|f| f["name"] == name)
                            .unwrap();
                        entry["bytes"] = serde_json::json!(bytes.len());
                        entry["fnv1a64"] = serde_json::json!(fnv1a64(&bytes));
                        std::fs::write(dir.join("manifest.json"), serde_json::to_vec(&m).unwrap())
                            .unwrap();
                        bytes
                    }
                };
                std::fs::write(dir.join(name), bytes).unwrap();
                open_and_load(&device, &dir, &saved, &tally)
            })
            .unwrap_or_else(|e| panic!("{e}"));
        (tally.into_inner(), not_applicable.get(), cases())
    })
    .unwrap()
    .remove(0);
    eprintln!(
        "malformed shard files: {n} inputs, {} refused with a typed error, {} loaded exactly \
         what was saved, {skipped} structure edits with no node to apply to",
        tally.refused, tally.loaded_exactly
    );
    assert_eq!(tally.refused + tally.loaded_exactly + skipped, u64::from(n));
    let panics = LIBRARY_PANICS.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(
        panics, 0,
        "the library panicked (and caught it) {panics} times"
    );
    assert!(tally.refused > 0, "{tally:?}");
}
