//! Writing column blocks into a preallocated output equals a plain CPU reference for shapes
//! that are multiples of nothing (1 x 1, a window at the right edge, one column, 1,000
//! columns), and a window outside the output or a block with other rows is refused.

use burn::backend::NdArray;
use burn::tensor::{Tensor, TensorData, TensorPrimitive};
use burn_rtp_kernels::{output_for_columns, write_columns, ColumnError, Float};

type B = NdArray;

fn tensor(rows: usize, cols: usize, seed: f32) -> Float<B> {
    let v: Vec<f32> = (0..rows * cols).map(|i| seed + i as f32 * 0.5).collect();
    Tensor::<B, 2>::from_data(TensorData::new(v, [rows, cols]), &Default::default())
        .into_primitive()
        .tensor()
}

fn values(t: Float<B>) -> Vec<f32> {
    Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(t))
        .into_data()
        .to_vec::<f32>()
        .unwrap()
}

/// Splits `columns` into blocks of the given widths, writes each into one output, and
/// compares with the blocks laid side by side on the host.
fn assembles(rows: usize, widths: &[usize]) {
    let columns: usize = widths.iter().sum();
    let blocks: Vec<(usize, Float<B>)> = widths
        .iter()
        .scan(0, |start, &w| {
            let s = *start;
            *start += w;
            Some((s, tensor(rows, w, s as f32 * 100.0)))
        })
        .collect();
    let mut want = vec![0f32; rows * columns];
    for (start, block) in &blocks {
        let w = block.shape()[1];
        let v = values(block.clone());
        for r in 0..rows {
            want[r * columns + start..r * columns + start + w]
                .copy_from_slice(&v[r * w..r * w + w]);
        }
    }
    let mut out = output_for_columns::<B>(&blocks[0].1, columns);
    // Any order: each window is written once.
    for (start, block) in blocks.into_iter().rev() {
        out = write_columns::<B>(out, block, start).unwrap();
    }
    assert_eq!(values(out), want, "rows {rows}, widths {widths:?}");
}

use burn::tensor::TensorMetadata;

#[test]
fn blocks_written_into_one_output_equal_the_reference() {
    assembles(1, &[1]);
    assembles(1, &[1, 1, 1]);
    assembles(3, &[2, 1]); // the last window ends at the right edge
    assembles(5, &[1, 4, 1, 1]); // one-column windows
    assembles(7, &[334, 333, 333]); // 1,000 columns split unevenly
    assembles(2, &[1000]); // a single window is the output itself
}

#[test]
fn a_window_outside_the_output_or_other_rows_are_refused() {
    let out = output_for_columns::<B>(&tensor(4, 3, 0.0), 10);
    assert_eq!(
        write_columns::<B>(out.clone(), tensor(4, 3, 0.0), 8).unwrap_err(),
        ColumnError::OutOfBounds {
            start: 8,
            end: 11,
            columns: 10,
            shape: vec![4, 10]
        }
    );
    assert!(matches!(
        write_columns::<B>(out, tensor(5, 3, 0.0), 0),
        Err(ColumnError::Rows { .. })
    ));
}
