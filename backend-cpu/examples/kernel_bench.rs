//! Single-thread throughput of the legacy-format decode kernels over 256 MB of weight rows (far
//! larger than the caches), the measurement behind `kernels::avx2::four_row_decode`.
//!
//! ```text
//! cargo run --release -p backend-cpu --example kernel_bench
//! ```

use std::error::Error;
use std::time::Instant;

use backend_cpu::kernels::{Legacy, Q8Rows, dot_rows};
use backend_cpu::quant::activation::{quantize_q8_0, quantize_q8_1};

const COLS: usize = 896;
const TOTAL_BYTES: usize = 256 << 20;

fn main() -> Result<(), Box<dyn Error>> {
    let x: Vec<f32> = (0..COLS)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    let (mut q8_0, mut q8_1) = (Vec::new(), Vec::new());
    quantize_q8_0(&x, &mut q8_0)?;
    quantize_q8_1(&x, &mut q8_1)?;
    for format in [
        Legacy::Q8_0,
        Legacy::Q4_0,
        Legacy::Q4_1,
        Legacy::Q5_0,
        Legacy::Q5_1,
    ] {
        let activations = if format.uses_q8_1() {
            Q8Rows::Q8_1(&q8_1)
        } else {
            Q8Rows::Q8_0(&q8_0)
        };
        let row_bytes = COLS / 32 * format.block_bytes();
        let rows = TOTAL_BYTES / row_bytes;
        let mut weights: Vec<u8> = (0..rows * row_bytes)
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        for block in weights.chunks_exact_mut(format.block_bytes()) {
            // Scale (and offset) 1.0 as f16, so sums stay finite.
            block[..2].copy_from_slice(&[0x00, 0x3c]);
        }
        let mut out = vec![0.0; rows];
        let reps = 4;
        let start = Instant::now();
        for _ in 0..reps {
            dot_rows(format, &weights, activations, 1, &mut out)?;
        }
        let seconds = start.elapsed().as_secs_f64();
        println!(
            "{format:?}: {:.2} GB/s, {:.2} ns per block",
            (reps * weights.len()) as f64 / seconds / 1e9,
            seconds * 1e9 / (reps * rows * COLS / 32) as f64
        );
    }
    Ok(())
}
