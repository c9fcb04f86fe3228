//! One rotated Linear's forward on NdArray: the concatenating composition (every shard's
//! block kept, then joined) against the preallocated one (each block written into one output),
//! at the GPT's config A shapes (512 tokens per rank, d_model 256, the MLP's 256 -> 1024 at
//! N = 4) and at d_model 1024 with 512 tokens per rank (1024 -> 4096 at N = 4). The backward
//! concatenates nothing in either version (dX accumulates, dW travels), so it is not here.
//!
//! Bytes moved by the composition (beyond the GEMMs): concatenating writes every block and
//! then copies all of them into the output (2 x output bytes written, 1 x read) and holds the
//! blocks and the output at once; the preallocated version writes every block and copies it
//! into its window (the same traffic on NdArray, which has no fused GEMM-into-window) but
//! holds one block beside the output. The figure printed with each group says so.

use burn::backend::NdArray;
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor};
use burn_rtp_kernels::{
    assemble_columns, linear_columns, output_for_columns, write_columns, Float,
};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};

type B = NdArray;
const SHARDS: usize = 4;

fn random(rows: usize, cols: usize) -> Float<B> {
    Tensor::<B, 2>::random([rows, cols], Distribution::Default, &Default::default())
        .into_primitive()
        .tensor()
}

fn concatenating(x: &Float<B>, shards: &[Float<B>]) -> Float<B> {
    let blocks = shards
        .iter()
        .map(|w| linear_columns::<B>(x.clone(), w.clone(), None))
        .collect();
    assemble_columns::<B>(blocks, 1)
}

fn preallocated(x: &Float<B>, shards: &[Float<B>]) -> Float<B> {
    let mut out = None;
    let mut start = 0;
    for w in shards {
        let block = linear_columns::<B>(x.clone(), w.clone(), None);
        let width = w.shape()[1];
        let y = out
            .take()
            .unwrap_or_else(|| output_for_columns::<B>(&block, width * shards.len()));
        out = Some(write_columns::<B>(y, block, start).expect("windows fit"));
        start += width;
    }
    out.expect("at least one shard")
}

use burn::tensor::TensorMetadata;

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("rotated_linear_forward");
    for (name, tokens, d_in, d_out) in [("config_a", 512, 256, 1024), ("d1024", 512, 1024, 4096)] {
        let x = random(tokens, d_in);
        let shards: Vec<Float<B>> = (0..SHARDS).map(|_| random(d_in, d_out / SHARDS)).collect();
        let out_mib = (tokens * d_out * 4) as f64 / (1 << 20) as f64;
        println!(
            "{name}: output {out_mib:.1} MiB; concatenating holds blocks + output ({:.1} MiB), preallocated output + one block ({:.1} MiB)",
            2.0 * out_mib,
            out_mib * (1.0 + 1.0 / SHARDS as f64)
        );
        group.bench_with_input(BenchmarkId::new("concatenating", name), &(), |b, _| {
            b.iter(|| {
                let y = concatenating(&x, &shards);
                B::sync(&Default::default()).unwrap();
                y
            })
        });
        group.bench_with_input(BenchmarkId::new("preallocated", name), &(), |b, _| {
            b.iter(|| {
                let y = preallocated(&x, &shards);
                B::sync(&Default::default()).unwrap();
                y
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
