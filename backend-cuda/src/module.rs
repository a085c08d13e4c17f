//! The kernels: `kernels/*.cu`, one program ([`source`]) loaded as one module. Its cubin for the
//! device's compute capability comes from the binary when the build embedded one (`build.rs`,
//! `LLORCH_NVRTC`: a new host then compiles nothing), else from a disk cache keyed by a hash of
//! the source, the options and the NVRTC version, else from NVRTC at start-up (then cached).

use std::ffi::{CStr, CString, c_char, c_int};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::{Ptx, result as nvrtc, sys as nvrtc_sys};
use worker_common::backend::BackendError;
use worker_common::gguf::GgmlType;

use crate::program::{WEIGHT_FORMATS, weight_format};
use crate::qgemm::TileShape;

pub use crate::program::{compile_options, source};

/// A cubin of [`source`] compiled by the build.
struct EmbeddedCubin {
    /// `sm_XY`.
    arch: &'static str,
    /// The NVRTC version that compiled it, `major.minor`.
    nvrtc: &'static str,
    cubin: &'static [u8],
}

/// The cubins `build.rs` embedded, one per architecture (none when built without `LLORCH_NVRTC`).
const EMBEDDED: &[EmbeddedCubin] = include!(concat!(env!("OUT_DIR"), "/embedded.rs"));

/// The formats of dense matrices (those of [`WEIGHT_FORMATS`] with a block decoder: dequantize
/// kernels), as GGUF types with their kernels' name suffix, in the table's order.
pub fn dense_formats() -> impl Iterator<Item = (GgmlType, &'static str)> {
    WEIGHT_FORMATS
        .iter()
        .filter(|f| f.block.is_some())
        .filter_map(|f| Some((GgmlType::from_id(f.id)?, f.suffix)))
}

/// The float formats (F32, F16, BF16: a block decoder, no int8 chunk decoder), which the f32
/// GEMVs and their many-row twin multiply, in the table's order.
pub fn float_formats() -> impl Iterator<Item = (GgmlType, &'static str)> {
    WEIGHT_FORMATS
        .iter()
        .filter(|f| f.float_dense())
        .filter_map(|f| Some((GgmlType::from_id(f.id)?, f.suffix)))
}

/// Whether the backend can multiply dense weights of `ggml_type`.
pub fn supports(ggml_type: GgmlType) -> bool {
    weight_format(ggml_type as u32).is_some_and(|f| f.block.is_some())
}

/// Every kernel of the program, loaded once.
pub struct Kernels {
    /// `dequant_*`, in [`dense_formats`] order.
    dequant: Vec<CudaFunction>,
    /// `gemv_*`, in [`float_formats`] order.
    gemv: Vec<CudaFunction>,
    /// `gemv_gated_*`, in [`float_formats`] order.
    gemv_gated: Vec<CudaFunction>,
    /// `fgemm_*`, in [`float_formats`] order.
    fgemm: Vec<CudaFunction>,
    /// The one-token int8-activation GEMV, `qgemv[log2 warps per row][rows per warp - 1]`
    /// (`qgemv_r1_t1_p1_s1`, …, `qgemv_r2_t1_p8_s1`).
    pub qgemv: Vec<[CudaFunction; 2]>,
    /// The batched one, up to eight tokens per block, `qgemv_batched[k][rows per warp - 1]`:
    /// k = 0 one warp per row, 1 two, 2 two with two token groups for rows of one segment
    /// (`qgemv_r1_t8_p1_s1`, …, `qgemv_r2_t8_p2_s2`).
    pub qgemv_batched: Vec<[CudaFunction; 2]>,
    /// The int8 tensor-core GEMM (`qgemm.cu`) for any mix of formats, per tile shape
    /// ([`TileShape`]: `qgemm_small`, `qgemm_large`).
    qgemm_mixed: [CudaFunction; 2],
    /// The same for launches of one format (`qgemm_small_*`, `qgemm_large_*`): each int8
    /// dense format of [`WEIGHT_FORMATS`] with its kernels.
    qgemm_one: Vec<(GgmlType, [CudaFunction; 2])>,
    /// Quantizes input rows once for the qgemv and qgemm launches that read them.
    pub quantize_rows: CudaFunction,
    /// RMSNorm per row.
    pub rms_norm: CudaFunction,
    /// Rotary position embedding in place, then the keys and values into the pool.
    pub rope_store: CudaFunction,
    /// Residual add.
    pub add: CudaFunction,
    /// SiLU- or GELU-gated product of gate and up.
    pub gated: CudaFunction,
    /// Splits a fused projection's rows.
    pub copy_cols: CudaFunction,
    /// Final logit soft-capping.
    pub softcap: CudaFunction,
    /// The greedy choice over each row of logits.
    pub argmax_logits: CudaFunction,
    /// Copies chosen rows together (the head's inputs).
    pub gather_rows: CudaFunction,
    /// Causal attention of a pass of long chunks over the cache, for heads of up to 64, 128
    /// and 256 elements.
    pub attention: [CudaFunction; 3],
    /// Decode attention split over the keys, merged by the last block.
    pub attention_split: CudaFunction,
    /// Routed experts (`moe.cu`, `moe_gemm.cu`).
    pub moe: MoeKernels,
    /// Keeps the module loaded as long as the functions are used.
    _module: Arc<CudaModule>,
}

impl Kernels {
    /// The dequantize kernel of `ggml_type`.
    pub fn dequant(&self, ggml_type: GgmlType) -> Result<&CudaFunction, BackendError> {
        type_index(dense_formats(), ggml_type).map(|i| &self.dequant[i])
    }

    /// The f32 GEMV kernel of float format `ggml_type`.
    pub fn gemv(&self, ggml_type: GgmlType) -> Result<&CudaFunction, BackendError> {
        type_index(float_formats(), ggml_type).map(|i| &self.gemv[i])
    }

    /// The gated gate-and-up f32 GEMV kernel of float format `ggml_type`.
    pub fn gemv_gated(&self, ggml_type: GgmlType) -> Result<&CudaFunction, BackendError> {
        type_index(float_formats(), ggml_type).map(|i| &self.gemv_gated[i])
    }

    /// The GEMV's many-row twin for float format `ggml_type`.
    pub fn fgemm(&self, ggml_type: GgmlType) -> Result<&CudaFunction, BackendError> {
        type_index(float_formats(), ggml_type).map(|i| &self.fgemm[i])
    }

    /// The tensor-core GEMM for a launch whose matrices are all of `one_format`, else (`None`,
    /// a mix) the kernel that dispatches on each block's format. Both give the same bits.
    pub fn qgemm(&self, one_format: Option<GgmlType>, shape: TileShape) -> &CudaFunction {
        let kernels = one_format
            .and_then(|t| self.qgemm_one.iter().find(|(k, _)| *k == t))
            .map_or(&self.qgemm_mixed, |(_, f)| f);
        &kernels[shape as usize]
    }

    /// Compiles (or reads from the cache) and loads the program for `ctx`'s device.
    pub fn load(ctx: &Arc<CudaContext>) -> Result<Self, BackendError> {
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| BackendError::Device(format!("reading the compute capability: {e}")))?;
        let module = load_program(ctx, &format!("sm_{major}{minor}"))?;
        // Each function is loaded now, not at its first launch (CUDA's lazy loading): a first
        // launch inside a capture would load there, and a load can synchronize the context,
        // which invalidates a capture under way (`forward.rs` then runs the pass uncaptured).
        let get = |name: &str| {
            let function = module
                .load_function(name)
                .map_err(|e| BackendError::Device(format!("kernel {name}: {e}")))?;
            // SAFETY: the handle is a live function of `module`, which `function` keeps loaded.
            unsafe { cudarc::driver::sys::cuFuncLoad(function.cu_function()) }
                .result()
                .map_err(|e| BackendError::Device(format!("loading kernel {name}: {e}")))?;
            Ok(function)
        };
        let qgemv_table = |tokens: usize, shapes: &[(usize, usize)]| {
            shapes
                .iter()
                .map(|(p, groups)| {
                    let name = |r: usize| format!("qgemv_r{r}_t{tokens}_p{p}_s{groups}");
                    Ok([get(&name(1))?, get(&name(2))?])
                })
                .collect::<Result<Vec<_>, BackendError>>()
        };
        let per_float = |prefix: &str| -> Result<Vec<CudaFunction>, BackendError> {
            float_formats()
                .map(|(_, suffix)| get(&format!("{prefix}_{suffix}")))
                .collect()
        };
        Ok(Self {
            dequant: dense_formats()
                .map(|(_, suffix)| get(&format!("dequant_{suffix}")))
                .collect::<Result<_, BackendError>>()?,
            gemv: per_float("gemv")?,
            gemv_gated: per_float("gemv_gated")?,
            fgemm: per_float("fgemm")?,
            qgemv: qgemv_table(1, &[(1, 1), (2, 1), (4, 1), (8, 1)])?,
            qgemv_batched: qgemv_table(8, &[(1, 1), (2, 1), (2, 2)])?,
            qgemm_mixed: [get("qgemm_small")?, get("qgemm_large")?],
            qgemm_one: WEIGHT_FORMATS
                .iter()
                .filter(|f| f.int8_dense())
                .filter_map(|f| Some((GgmlType::from_id(f.id)?, f.suffix)))
                .map(|(t, suffix)| {
                    let small = get(&format!("qgemm_small_{suffix}"))?;
                    Ok((t, [small, get(&format!("qgemm_large_{suffix}"))?]))
                })
                .collect::<Result<_, BackendError>>()?,
            quantize_rows: get("quantize_rows")?,
            rms_norm: get("rms_norm")?,
            rope_store: get("rope_store")?,
            add: get("add")?,
            gated: get("gated")?,
            copy_cols: get("copy_cols")?,
            softcap: get("softcap")?,
            argmax_logits: get("argmax_logits")?,
            gather_rows: get("gather_rows")?,
            attention: [
                get("attention_h64")?,
                get("attention_h128")?,
                get("attention_h256")?,
            ],
            attention_split: get("attention_split")?,
            moe: MoeKernels {
                route: get("moe_route")?,
                group: get("moe_group")?,
                gather: get("moe_gather")?,
                sum: get("moe_sum")?,
                gate_up: [
                    get("moe_pair_gate_up")?,
                    get("moe_gate_up")?,
                    get("moe_gemm_gate_up")?,
                ],
                down: [
                    get("moe_pair_down")?,
                    get("moe_down")?,
                    get("moe_gemm_down")?,
                ],
            },
            _module: module,
        })
    }
}

/// The routed experts' kernels: each row's choice, the pairs grouped by expert and their
/// inputs gathered, the weighted sum of a row's slots; the gated gate and up products and the
/// down products, each for a pass of one row (pair by pair), of short chunks (grouped, int8
/// GEMV arithmetic) and of long chunks (grouped, tensor-core GEMM arithmetic), in that order
/// ([`ExpertKernel`](crate::moe::ExpertKernel)).
pub struct MoeKernels {
    /// `moe_route`.
    pub route: CudaFunction,
    /// `moe_group`.
    pub group: CudaFunction,
    /// `moe_gather`.
    pub gather: CudaFunction,
    /// `moe_sum`.
    pub sum: CudaFunction,
    /// `moe_pair_gate_up`, `moe_gate_up`, `moe_gemm_gate_up`.
    pub gate_up: [CudaFunction; 3],
    /// `moe_pair_down`, `moe_down`, `moe_gemm_down`.
    pub down: [CudaFunction; 3],
}

fn type_index(
    mut formats: impl Iterator<Item = (GgmlType, &'static str)>,
    ggml_type: GgmlType,
) -> Result<usize, BackendError> {
    formats
        .position(|(t, _)| t == ggml_type)
        .ok_or_else(|| BackendError::Unsupported {
            backend: "bespoke-cuda",
            what: format!("weights of type {ggml_type}"),
        })
}

/// The kernel module for `arch`: the build's embedded cubin when there is one and the driver
/// takes it, else [`cubin_for`]'s.
fn load_program(ctx: &Arc<CudaContext>, arch: &str) -> Result<Arc<CudaModule>, BackendError> {
    if let Some(embedded) = EMBEDDED.iter().find(|e| e.arch == arch) {
        let started = Instant::now();
        match ctx.load_module(Ptx::from_binary(embedded.cubin.to_vec())) {
            Ok(module) => {
                tracing::info!(
                    arch,
                    source = "embedded",
                    nvrtc = embedded.nvrtc,
                    ms = started.elapsed().as_millis() as u64,
                    "kernels loaded as compiled by the build: nothing to compile"
                );
                return Ok(module);
            }
            Err(e) => tracing::warn!(
                arch,
                error = %e,
                "the driver does not take the embedded kernels; compiling them"
            ),
        }
    }
    let cubin = cubin_for(arch)?;
    ctx.load_module(Ptx::from_binary(cubin))
        .map_err(|e| BackendError::Device(format!("loading the kernel module: {e}")))
}

/// The cubin of [`source`] for `arch` (e.g. `sm_90`), from the disk cache or NVRTC; logs
/// which, and how long it took.
pub fn cubin_for(arch: &str) -> Result<Vec<u8>, BackendError> {
    let options = compile_options(arch);
    let version = nvrtc_version()?;
    let source = source();
    let key = fnv1a(&[&source, &options.join(" "), &version]);
    let file = cache_dir().map(|dir| dir.join(format!("llorch-{key:016x}-{arch}.cubin")));
    let started = Instant::now();
    if let Some(cached) = file.as_deref().and_then(|f| std::fs::read(f).ok()) {
        tracing::info!(
            arch,
            source = "cache",
            ms = started.elapsed().as_millis() as u64,
            "kernels read from the cache"
        );
        return Ok(cached);
    }
    let cubin = compile(&source, c"llorch_kernels.cu", &options)?;
    tracing::info!(
        arch,
        source = "nvrtc",
        nvrtc = %version,
        ms = started.elapsed().as_millis() as u64,
        "kernels compiled (the cache had none)"
    );
    if let Some(file) = &file
        && let Err(e) = store(file, &cubin)
    {
        tracing::warn!(path = %file.display(), error = %e, "cannot cache the compiled kernels");
    }
    Ok(cubin)
}

fn nvrtc_version() -> Result<String, BackendError> {
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: both pointers are valid for writes; the library was checked to be present.
    unsafe { nvrtc_sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| BackendError::Device(format!("nvrtcVersion: {e:?}")))?;
    Ok(format!("{major}.{minor}"))
}

/// Compiles `source` (named `name` in NVRTC's messages) to a cubin; a compile error carries
/// NVRTC's log.
pub fn compile(source: &str, name: &CStr, options: &[String]) -> Result<Vec<u8>, BackendError> {
    let source = CString::new(source)
        .map_err(|_| BackendError::Device("kernel source contains a NUL byte".to_owned()))?;
    let prog = nvrtc::create_program(&source, Some(name))
        .map_err(|e| BackendError::Device(format!("nvrtcCreateProgram: {e:?}")))?;
    let program = Program(prog);
    // SAFETY: `program.0` was just created and is destroyed only by `Program::drop`.
    let compiled = unsafe { nvrtc::compile_program(program.0, options) };
    if let Err(e) = compiled {
        // SAFETY: as above.
        let log = unsafe { nvrtc::get_program_log(program.0) }
            .map(|raw| c_chars_to_string(&raw))
            .unwrap_or_default();
        return Err(BackendError::Device(format!(
            "compiling the kernels ({e:?}, options {options:?}):\n{log}"
        )));
    }
    let mut size = 0usize;
    // SAFETY: `size` is valid for writes; the program compiled.
    unsafe { nvrtc_sys::nvrtcGetCUBINSize(program.0, &mut size) }
        .result()
        .map_err(|e| BackendError::Device(format!("nvrtcGetCUBINSize: {e:?}")))?;
    let mut cubin = vec![0u8; size];
    // SAFETY: `cubin` holds the `size` bytes NVRTC reported.
    unsafe { nvrtc_sys::nvrtcGetCUBIN(program.0, cubin.as_mut_ptr().cast::<c_char>()) }
        .result()
        .map_err(|e| BackendError::Device(format!("nvrtcGetCUBIN: {e:?}")))?;
    Ok(cubin)
}

/// Destroys the NVRTC program on every path out of [`compile`].
struct Program(nvrtc_sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the program was created by `create_program` and is destroyed once, here.
        if let Err(e) = unsafe { nvrtc::destroy_program(self.0) } {
            tracing::warn!("nvrtcDestroyProgram: {e:?}");
        }
    }
}

fn c_chars_to_string(raw: &[c_char]) -> String {
    let bytes: Vec<u8> = raw.iter().map(|&c| c as u8).collect();
    CStr::from_bytes_until_nul(&bytes)
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into_owned())
}

/// `$LLORCH_CUDA_CACHE`, else `$XDG_CACHE_HOME/llorch/kernels`, else `~/.cache/llorch/kernels`.
fn cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("LLORCH_CUDA_CACHE") {
        return Some(PathBuf::from(dir));
    }
    let base = match std::env::var_os("XDG_CACHE_HOME") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME")?).join(".cache"),
    };
    Some(base.join("llorch").join("kernels"))
}

/// Writes through a temporary name and renames, so a concurrent start never reads half a file.
fn store(file: &Path, cubin: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let temp = file.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&temp, cubin)?;
    std::fs::rename(&temp, file)
}

/// 64-bit FNV-1a over the parts (each followed by a 0 byte): stable across Rust releases,
/// unlike `DefaultHasher`, so the cache key survives a toolchain update.
fn fnv1a(parts: &[&str]) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    for part in parts {
        for &byte in part.as_bytes().iter().chain(&[0u8]) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each format of the table is the GGUF type of its id, named by its kernels' suffix.
    #[test]
    fn every_weight_format_is_the_gguf_type_of_its_id() {
        for f in &WEIGHT_FORMATS {
            let t = GgmlType::from_id(f.id).unwrap_or_else(|| panic!("{} is no type", f.id));
            assert_eq!(t.name().to_lowercase(), f.suffix);
        }
        let dense: Vec<&str> = dense_formats().map(|(_, s)| s).collect();
        assert_eq!(dense.len(), 11);
        assert!(!supports(GgmlType::MXFP4) && supports(GgmlType::Q6_K));
    }

    /// The formats only the CPU backend reads have no kernel here, so a file with one is
    /// refused at load, naming the tensor and its type (`weights.rs`), not run wrong.
    #[test]
    fn the_cpu_only_formats_have_no_kernel() {
        for t in [
            GgmlType::Q2_K,
            GgmlType::Q3_K,
            GgmlType::IQ4_NL,
            GgmlType::IQ4_XS,
            GgmlType::IQ3_S,
            GgmlType::IQ3_XXS,
        ] {
            assert!(!supports(t), "{t}");
            assert!(
                WEIGHT_FORMATS
                    .iter()
                    .all(|f| f.suffix != t.name().to_lowercase())
            );
        }
    }

    /// The chunk dispatch names every chunk format once, the last as its default.
    #[test]
    fn the_chunk_dispatch_covers_every_chunk_format() {
        let macros = crate::program::format_macros();
        let switch = macros
            .lines()
            .find(|l| l.starts_with("#define LLORCH_CHUNK_SWITCH"))
            .unwrap();
        for f in WEIGHT_FORMATS.iter().filter(|f| f.chunk.is_some()) {
            assert_eq!(switch.matches(f.chunk.unwrap()).count(), 1, "{switch}");
        }
        assert!(switch.contains("case 39: CALL(ChunkMXFP4"), "{switch}");
        assert!(switch.contains("default: CALL(ChunkQ6_K"), "{switch}");
        assert_eq!(switch.matches("case ").count(), 8);
    }

    /// An embedded cubin is what NVRTC compiles here, when it is the version that built it: the
    /// same bits whichever way a start gets its kernels.
    #[test]
    #[ignore = "needs an NVIDIA GPU"]
    fn an_embedded_cubin_is_what_nvrtc_compiles_at_start_up() {
        let ctx = CudaContext::new(0).unwrap();
        let (major, minor) = ctx.compute_capability().unwrap();
        let arch = format!("sm_{major}{minor}");
        let Some(embedded) = EMBEDDED.iter().find(|e| e.arch == arch) else {
            panic!("no cubin for {arch} embedded: build with LLORCH_NVRTC to test this");
        };
        let version = nvrtc_version().unwrap();
        assert_eq!(embedded.nvrtc, version, "embedded by another NVRTC");
        let compiled = compile(&source(), c"llorch_kernels.cu", &compile_options(&arch)).unwrap();
        assert!(compiled == embedded.cubin, "{arch}: the cubins differ");
        Kernels::load(&ctx).unwrap();
    }

    #[test]
    fn cache_key_depends_on_every_part() {
        let base = fnv1a(&["a", "b"]);
        assert_ne!(base, fnv1a(&["ab", ""]));
        assert_ne!(base, fnv1a(&["a", "c"]));
        assert_eq!(base, fnv1a(&["a", "b"]));
    }
}
