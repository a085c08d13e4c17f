// The kernel program and how it is compiled: one definition, read by the crate (`module.rs`,
// which compiles it at start-up when no cubin for the device was embedded) and by `build.rs`
// (`include!`d there, so no inner doc comment and nothing but `std`), which compiles it ahead of
// time when asked.

include!("params.rs");
include!("formats.rs");

/// The kernel files of the one NVRTC program, in dependency order (helpers first).
pub const KERNEL_FILES: [(&str, &str); 8] = [
    ("prelude.cu", include_str!("../kernels/prelude.cu")),
    ("quant.cu", include_str!("../kernels/quant.cu")),
    ("qgemv.cu", include_str!("../kernels/qgemv.cu")),
    ("moe.cu", include_str!("../kernels/moe.cu")),
    ("qgemm.cu", include_str!("../kernels/qgemm.cu")),
    ("moe_gemm.cu", include_str!("../kernels/moe_gemm.cu")),
    ("ops.cu", include_str!("../kernels/ops.cu")),
    ("attention.cu", include_str!("../kernels/attention.cu")),
];

/// Marks where each part of [`source`] begins (`scripts/nvrtc-timing.py` splits on it).
pub const PART_MARK: &str = "// ---- llorch part: ";

/// The one NVRTC program: what Rust defines for the kernels (the parameter structs,
/// [`param_definitions`], and the format macros, [`format_macros`]), then the kernel files in
/// order, each part opened by a [`PART_MARK`] line.
pub fn source() -> String {
    let mut text = format!(
        "{PART_MARK}program.rs\n{}{}",
        param_definitions(),
        format_macros()
    );
    for (name, file) in KERNEL_FILES {
        text.push_str(&format!("{PART_MARK}{name}\n{file}"));
    }
    text
}

/// Positions per KV page: the seam's `worker_common::backend::PAGE_SIZE` (lib.rs asserts the two
/// equal at compile time).
pub const PAGE_SIZE: usize = 16;
/// Warps per block of the f32 GEMV kernels (quant.cu).
pub const GEMV_WARPS: usize = 4;
/// Weight rows and input rows a warp of the float formats' many-row twin holds (quant.cu's
/// `fgemm`): one output a lane.
pub const FG_ROWS: usize = 4;
/// See [`FG_ROWS`].
pub const FG_TOKENS: usize = 8;
/// The "virtual threads" of RMSNorm's one order (prelude.cu's `rms_scale`): a block of any
/// size that divides it sums a row's squares as `rms_norm`'s block of this many threads.
pub const NORM_THREADS: usize = 256;
/// Warps per block of the int8-activation GEMV kernels (qgemv.cu).
pub const QG_WARPS: usize = 8;
/// 32-element chunks per segment of the quantized products' one order (qgemv.cu): a segment is
/// summed by one pairwise tree, the segments in order.
pub const QG_SEG: usize = 32;
/// Segments of the widest input a quantized launch takes.
pub const QG_MAX_SEGMENTS: usize = 32;
/// Keys per chunk of the attention's one order, one per thread of a split block (attention.cu).
pub const ATT_CHUNK: usize = 128;
/// Widest head the attention kernels hold in registers (attention.cu).
pub const MAX_HEAD: usize = 256;
/// Warps a block of the prefill attention kernel for heads of up to 64 elements
/// (`attention_h64`, attention.cu's `AttSize`), and the query rows each warp holds. The kernel
/// scores a warp's rows one after the other, each reading its keys from shared memory anew, so
/// more rows a warp only cost parallelism: on the 8B shape (H200, `examples/prefill`) 8 warps
/// of 4 rows took an 8,192-token prompt in 4.24 s, 4 of 8 in 5.98 s, 16 of 1 in 3.92 s.
pub const ATT_H64_WARPS: usize = 16;
/// See [`ATT_H64_WARPS`].
pub const ATT_H64_QPW: usize = 1;
/// The same for heads of up to 128 elements (`attention_h128`).
pub const ATT_H128_WARPS: usize = 16;
/// See [`ATT_H128_WARPS`].
pub const ATT_H128_QPW: usize = 1;
/// The same for heads of up to [`MAX_HEAD`] (`attention_h256`).
pub const ATT_H256_WARPS: usize = 4;
/// See [`ATT_H256_WARPS`].
pub const ATT_H256_QPW: usize = 2;
/// Warps of a tensor-core GEMM block along its weight rows and its tokens (qgemm.cu's shapes),
/// each on 16-row × 8-token mma tiles: the small shape one tile a warp (32 × 32).
pub const QM_WARPS_M: usize = 2;
/// See [`QM_WARPS_M`].
pub const QM_WARPS_N: usize = 4;
/// The large shape's mma tiles a warp along the rows and the tokens (`QmLarge`).
pub const QM_LARGE_MT: usize = 2;
/// See [`QM_LARGE_MT`].
pub const QM_LARGE_NT: usize = 1;

/// What a quantized launch (`qgemv_*`, `qgemm_*`) does with its products, its `mode`: store
/// (`y = W·x + bias`).
pub const QG_STORE: usize = 0;
/// Accumulate into the residual stream (`y += W·x`).
pub const QG_ACCUMULATE: usize = 1;
/// Gate (matrix 0) and up (matrix 1): `y0 = silu(gate·x) · (up·x)`.
pub const QG_SILU: usize = 2;
/// The same with GELU.
pub const QG_GELU: usize = 3;
/// Q, K and V rows in RoPE pairs: Q rotated, K rotated and V into the pool.
pub const QG_ROPE: usize = 4;

/// The constants above that the kernels read, by the names they read them under: each is
/// defined here alone and passed to NVRTC as `-D` (no `.cu` file defines it).
pub const KERNEL_CONSTANTS: [(&str, usize); 25] = [
    ("PAGE_SIZE", PAGE_SIZE),
    ("GEMV_WARPS", GEMV_WARPS),
    ("FG_ROWS", FG_ROWS),
    ("FG_TOKENS", FG_TOKENS),
    ("NORM_THREADS", NORM_THREADS),
    ("QG_WARPS", QG_WARPS),
    ("QG_SEG", QG_SEG),
    ("QG_MAX_SEGMENTS", QG_MAX_SEGMENTS),
    ("ATT_CHUNK", ATT_CHUNK),
    ("MAX_HEAD", MAX_HEAD),
    ("QM_WARPS_M", QM_WARPS_M),
    ("QM_WARPS_N", QM_WARPS_N),
    ("QM_LARGE_MT", QM_LARGE_MT),
    ("QM_LARGE_NT", QM_LARGE_NT),
    ("ATT_H64_WARPS", ATT_H64_WARPS),
    ("ATT_H64_QPW", ATT_H64_QPW),
    ("ATT_H128_WARPS", ATT_H128_WARPS),
    ("ATT_H128_QPW", ATT_H128_QPW),
    ("ATT_H256_WARPS", ATT_H256_WARPS),
    ("ATT_H256_QPW", ATT_H256_QPW),
    ("QG_STORE", QG_STORE),
    ("QG_ACCUMULATE", QG_ACCUMULATE),
    ("QG_SILU", QG_SILU),
    ("QG_GELU", QG_GELU),
    ("QG_ROPE", QG_ROPE),
];

/// NVRTC options: a cubin for exactly this GPU (no PTX left for the driver to compile), no
/// contraction of products and sums into fused multiply-adds (see prelude.cu), and the shared
/// constants.
pub fn compile_options(arch: &str) -> Vec<String> {
    let mut options = vec![
        format!("--gpu-architecture={arch}"),
        "--fmad=false".to_owned(),
        "--std=c++17".to_owned(),
    ];
    options.extend(
        KERNEL_CONSTANTS
            .iter()
            .map(|(name, value)| format!("-D{name}={value}")),
    );
    options
}
