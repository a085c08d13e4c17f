// The kernel program and how it is compiled: one definition, read by the crate (`module.rs`,
// which compiles it at start-up when no cubin for the device was embedded) and by `build.rs`
// (`include!`d there, so no inner doc comment and nothing but `std`), which compiles it ahead of
// time when asked.

/// The one NVRTC program: the files in dependency order (helpers first).
pub const SOURCE: &str = concat!(
    include_str!("../kernels/prelude.cu"),
    include_str!("../kernels/quant.cu"),
    include_str!("../kernels/qgemv.cu"),
    include_str!("../kernels/moe.cu"),
    include_str!("../kernels/qgemm.cu"),
    include_str!("../kernels/moe_gemm.cu"),
    include_str!("../kernels/ops.cu"),
    include_str!("../kernels/attention.cu"),
);

/// NVRTC options: a cubin for exactly this GPU (no PTX left for the driver to compile), and
/// no contraction of products and sums into fused multiply-adds (see prelude.cu).
pub fn compile_options(arch: &str) -> Vec<String> {
    vec![
        format!("--gpu-architecture={arch}"),
        "--fmad=false".to_owned(),
        "--std=c++17".to_owned(),
    ]
}
