//! Single-thread throughput of the matrix kernels, the measurements behind their tile
//! choices: decode (one token) streams 256 MB of weight rows, far larger than the caches
//! prefill runs Qwen2.5-0.5B-sized `ffn_up` (4864 rows of
//! 896) and `ffn_down` (896 rows of 4864) against 64 tokens, the k-quants tiled and, for
//! comparison, one row × one token per call.
//! Batched decode (`batch`) streams 64 MB of rows against 1, 2, 4, 8 and 16 tokens, SmolLM2's
//! and Qwen2.5-0.5B's formats (the k-quants both in the GGUF layout and repacked): what a
//! decode step of that many sequences pays per matrix.
//! Best of several runs, so other load on a shared machine inflates the numbers less.
//!
//! ```text
//! cargo run --release -p backend-cpu --example kernel_bench [batch]
//! ```

use std::error::Error;
use std::time::Instant;

use backend_cpu::kernels::rows::{self as dot, KQuant};
use backend_cpu::kernels::{
    Legacy, PackedK, PackedQ6K, PackedRows, Q8Rows, block_meta, dot_packed, dot_packed_k,
};
use backend_cpu::quant::activation::{BlockQ8K, quantize_q8_0, quantize_q8_1, quantize_q8_k};

/// One k-quant matrix against `n` tokens of activations, into `out`.
type KRun<'a> = dyn Fn(&[BlockQ8K], usize, &mut [f32]) -> Result<(), Box<dyn Error>> + 'a;

const COLS: usize = 896;
const TOTAL_BYTES: usize = 256 << 20;
/// Runs of a decode measurement (256 MB each).
const DECODE_REPS: usize = 4;
/// Runs of a prefill measurement (a few milliseconds each).
const PREFILL_REPS: usize = 20;

/// The fastest of `reps` runs of `f`, in seconds.
fn best(
    reps: usize,
    mut f: impl FnMut() -> Result<(), Box<dyn Error>>,
) -> Result<f64, Box<dyn Error>> {
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let start = Instant::now();
        f()?;
        best = best.min(start.elapsed().as_secs_f64());
    }
    Ok(best)
}

/// Deterministic activations in [-1, 1).
fn activations(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect()
}

/// `len` weight bytes with every `block`-byte block's f16 scales at `scales` set to 1/64, so
/// sums stay finite.
fn weights(len: usize, block: usize, scales: &[usize]) -> Vec<u8> {
    let mut w: Vec<u8> = (0..len)
        .map(|i| (i ^ (i >> 9)).wrapping_mul(31) as u8)
        .collect();
    for b in w.chunks_exact_mut(block) {
        for &at in scales {
            b[at..at + 2].copy_from_slice(&[0x00, 0x24]);
        }
    }
    w
}

/// All rows of `w` against `n` tokens, as the matmul calls the kernel (block meta included).
fn dot_rows(
    w: &PackedRows,
    a: Q8Rows<'_>,
    n: usize,
    out: &mut [f32],
) -> Result<(), Box<dyn Error>> {
    let mut meta = Vec::new();
    block_meta(a, &mut meta);
    Ok(dot_packed(w, 0..w.groups(), a, &meta, n, out)?)
}

fn legacy_decode() -> Result<(), Box<dyn Error>> {
    let x = activations(COLS);
    let (mut q8_0, mut q8_1) = (Vec::new(), Vec::new());
    quantize_q8_0(&x, &mut q8_0)?;
    quantize_q8_1(&x, &mut q8_1)?;
    for format in [
        Legacy::Q8_0,
        Legacy::Q4_0,
        Legacy::Q4_1,
        Legacy::Q5_0,
        Legacy::Q5_1,
        Legacy::Iq4Nl,
    ] {
        let activations = if format.uses_q8_1() {
            Q8Rows::Q8_1(&q8_1)
        } else {
            Q8Rows::Q8_0(&q8_0)
        };
        let row_bytes = COLS / 32 * format.block_bytes();
        let rows = TOTAL_BYTES / row_bytes;
        let offsets: &[usize] = if format.uses_q8_1() { &[0, 2] } else { &[0] };
        let weights = weights(rows * row_bytes, format.block_bytes(), offsets);
        let packed = PackedRows::pack(format, &weights, rows)?;
        let mut out = vec![0.0; rows];
        let seconds = best(DECODE_REPS, || dot_rows(&packed, activations, 1, &mut out))?;
        println!(
            "decode {format:?}: {:.2} GB/s, {:.2} ns per block",
            weights.len() as f64 / seconds / 1e9,
            seconds * 1e9 / (rows * COLS / 32) as f64
        );
    }
    Ok(())
}

/// The k-quant formats (and IQ4_XS, IQ3_S, IQ3_XXS, which share their super-block) the
/// GGUF-layout tiles read.
const K_FORMATS: [KQuant; 8] = [
    KQuant::Q2K,
    KQuant::Q3K,
    KQuant::Q4K,
    KQuant::Q5K,
    KQuant::Q6K,
    KQuant::Iq4Xs,
    KQuant::Iq3S,
    KQuant::Iq3Xxs,
];

/// The d (and dmin) offsets of a k-quant super-block.
fn k_scales(format: KQuant) -> &'static [usize] {
    match format {
        KQuant::Q2K => &[80, 82],
        KQuant::Q3K => &[108],
        KQuant::Q6K => &[208],
        KQuant::Iq4Xs | KQuant::Iq3S | KQuant::Iq3Xxs => &[0],
        _ => &[0, 2],
    }
}

fn k_decode() -> Result<(), Box<dyn Error>> {
    let cols = 4864;
    let mut q8_k = Vec::new();
    quantize_q8_k(&activations(cols), &mut q8_k)?;
    for format in K_FORMATS {
        let row_bytes = cols / 256 * format.block_bytes();
        let rows = TOTAL_BYTES / row_bytes;
        let weights = weights(rows * row_bytes, format.block_bytes(), k_scales(format));
        let mut out = vec![0.0; rows];
        let seconds = best(DECODE_REPS, || {
            Ok(dot::dot_rows_k(format, &weights, &q8_k, 1, &mut out)?)
        })?;
        println!(
            "decode {format:?}: {:.2} GB/s, {:.1} ns per super-block",
            weights.len() as f64 / seconds / 1e9,
            seconds * 1e9 / (rows * cols / 256) as f64
        );
    }
    Ok(())
}

fn k_prefill() -> Result<(), Box<dyn Error>> {
    let (rows, cols, tokens) = (896, 4864, 64);
    let mut q8_k = Vec::new();
    quantize_q8_k(&activations(cols * tokens), &mut q8_k)?;
    let per_token = cols / 256;
    for format in K_FORMATS {
        let row_bytes = per_token * format.block_bytes();
        let weights = weights(rows * row_bytes, format.block_bytes(), k_scales(format));
        let mut out = vec![0.0; rows * tokens];
        let tiled = best(PREFILL_REPS, || {
            Ok(dot::dot_rows_k(format, &weights, &q8_k, tokens, &mut out)?)
        })?;
        let one = match format {
            KQuant::Q2K => dot::dot_q2_k_q8_k,
            KQuant::Q3K => dot::dot_q3_k_q8_k,
            KQuant::Q4K => dot::dot_q4_k_q8_k,
            KQuant::Q5K => dot::dot_q5_k_q8_k,
            KQuant::Q6K => dot::dot_q6_k_q8_k,
            KQuant::Iq4Xs => dot::dot_iq4_xs_q8_k,
            KQuant::Iq3S => dot::dot_iq3_s_q8_k,
            KQuant::Iq3Xxs => dot::dot_iq3_xxs_q8_k,
        };
        let per_row = best(PREFILL_REPS, || {
            for (row, out) in weights
                .chunks_exact(row_bytes)
                .zip(out.chunks_exact_mut(tokens))
            {
                for (o, a) in out.iter_mut().zip(q8_k.chunks_exact(per_token)) {
                    *o = one(row, a)?;
                }
            }
            Ok(())
        })?;
        let dots = (rows * tokens * per_token) as f64;
        println!(
            "prefill {format:?}: tiled {:.1} ns, one row × token per call {:.1} ns per \
             super-block dot",
            tiled * 1e9 / dots,
            per_row * 1e9 / dots
        );
    }
    Ok(())
}

fn legacy_prefill() -> Result<(), Box<dyn Error>> {
    let (rows, tokens) = (4864, 64);
    let x = activations(COLS * tokens);
    let (mut q8_0, mut q8_1) = (Vec::new(), Vec::new());
    quantize_q8_0(&x, &mut q8_0)?;
    quantize_q8_1(&x, &mut q8_1)?;
    for format in [Legacy::Q8_0, Legacy::Q4_1, Legacy::Q5_0, Legacy::Iq4Nl] {
        let activations = if format.uses_q8_1() {
            Q8Rows::Q8_1(&q8_1)
        } else {
            Q8Rows::Q8_0(&q8_0)
        };
        let row_bytes = COLS / 32 * format.block_bytes();
        let offsets: &[usize] = if format.uses_q8_1() { &[0, 2] } else { &[0] };
        let weights = weights(rows * row_bytes, format.block_bytes(), offsets);
        let packed = PackedRows::pack(format, &weights, rows)?;
        let mut out = vec![0.0; rows * tokens];
        let seconds = best(PREFILL_REPS, || {
            dot_rows(&packed, activations, tokens, &mut out)
        })?;
        println!(
            "prefill {format:?}: {:.2} ns per block dot",
            seconds * 1e9 / (rows * tokens * COLS / 32) as f64
        );
    }
    Ok(())
}

/// Tokens of the batched-decode measurement.
const BATCHES: [usize; 5] = [1, 2, 4, 8, 16];

/// Decode steps of `BATCHES` tokens over 64 MB of rows: time per step relative to one token.
fn batched_decode() -> Result<(), Box<dyn Error>> {
    let bytes = 64 << 20;
    for format in [Legacy::Q4_1, Legacy::Q8_0] {
        let row_bytes = COLS / 32 * format.block_bytes();
        let rows = bytes / row_bytes;
        let offsets: &[usize] = if format.uses_q8_1() { &[0, 2] } else { &[0] };
        let weights = weights(rows * row_bytes, format.block_bytes(), offsets);
        let packed = PackedRows::pack(format, &weights, rows)?;
        let mut line = format!("batched decode {format:?} ({rows} rows of {COLS}):");
        let mut one = 0.0;
        for n in BATCHES {
            let x = activations(COLS * n);
            let (mut q8_0, mut q8_1) = (Vec::new(), Vec::new());
            quantize_q8_0(&x, &mut q8_0)?;
            quantize_q8_1(&x, &mut q8_1)?;
            let activations = if format.uses_q8_1() {
                Q8Rows::Q8_1(&q8_1)
            } else {
                Q8Rows::Q8_0(&q8_0)
            };
            let mut out = vec![0.0; rows * n];
            let seconds = best(DECODE_REPS, || dot_rows(&packed, activations, n, &mut out))?;
            if n == 1 {
                one = seconds;
            }
            line += &format!(" n={n} {:.2} ms ({:.2}×)", seconds * 1e3, seconds / one);
        }
        println!("{line}");
    }
    // Qwen2.5-0.5B's k-quant matrices are its 4864-wide `ffn_down`: in the GGUF layout
    // (the reference tiles) and repacked (what the worker runs).
    let cols = 4864;
    for format in [KQuant::Q4K, KQuant::Q6K] {
        let row_bytes = cols / 256 * format.block_bytes();
        let rows = bytes / row_bytes;
        let weights = weights(rows * row_bytes, format.block_bytes(), k_scales(format));
        for repacked in [false, true] {
            let layout = if repacked { "repacked" } else { "GGUF layout" };
            let mut line = format!("batched decode {format:?}, {layout} ({rows} rows of {cols}):");
            let run: Box<KRun> = match (repacked, format) {
                (false, _) => {
                    Box::new(|a, n, out| Ok(dot::dot_rows_k(format, &weights, a, n, out)?))
                }
                (true, KQuant::Q4K) => {
                    let packed = PackedK::pack(&weights, rows).ok_or("Q4_K packing")?;
                    Box::new(move |a, n, out| {
                        Ok(dot_packed_k(&packed, 0..packed.groups(), a, n, out)?)
                    })
                }
                (true, _) => {
                    let packed = PackedQ6K::pack(&weights, rows).ok_or("Q6_K packing")?;
                    Box::new(move |a, n, out| {
                        Ok(dot_packed_k(&packed, 0..packed.groups(), a, n, out)?)
                    })
                }
            };
            let mut one = 0.0;
            for n in BATCHES {
                let mut q8_k = Vec::new();
                quantize_q8_k(&activations(cols * n), &mut q8_k)?;
                let mut out = vec![0.0; rows * n];
                let seconds = best(DECODE_REPS, || run(&q8_k, n, &mut out))?;
                if n == 1 {
                    one = seconds;
                }
                line += &format!(" n={n} {:.2} ms ({:.2}×)", seconds * 1e3, seconds / one);
            }
            println!("{line}");
        }
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn Error>> {
    if std::env::args().nth(1).as_deref() == Some("batch") {
        return batched_decode();
    }
    legacy_prefill()?;
    legacy_decode()?;
    k_decode()?;
    k_prefill()
}
