// The weight formats the kernels read, listed once: which kernels read each, under which names,
// and the C++ macros the kernel files expand over them (`format_macros`), so that no kernel file,
// launch or test keeps a list of its own (`include!`d by program.rs, hence by build.rs: `std`
// only, no inner doc comment).

/// One weight format: its GGUF type id and the kernels that read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WeightFormat {
    /// The GGUF type id: the kernels' `format` parameter.
    pub id: u32,
    /// The name suffix of its kernels (`dequant_q4_k`, `qgemm_small_q4_k`).
    pub suffix: &'static str,
    /// quant.cu's block decoder, for the formats of dense matrices (`dequant_*`; the float
    /// formats' `gemv_*`, `gemv_gated_*`, `fgemm_*`).
    pub block: Option<&'static str>,
    /// qgemv.cu's int8 chunk decoder, for the formats the int8-activation kernels multiply
    /// (the GEMVs, the tensor-core GEMM, the routed experts).
    pub chunk: Option<&'static str>,
}

impl WeightFormat {
    /// Dense matrices of this format take the int8-activation GEMVs and the GEMM.
    pub const fn int8_dense(&self) -> bool {
        self.block.is_some() && self.chunk.is_some()
    }

    /// Dense matrices of this format take the f32 GEMVs and their twin (quant.cu's THE FLOAT
    /// ORDER): a block decoder and no int8 chunk decoder.
    pub const fn float_dense(&self) -> bool {
        self.block.is_some() && self.chunk.is_none()
    }
}

const fn format(
    id: u32,
    suffix: &'static str,
    block: Option<&'static str>,
    chunk: Option<&'static str>,
) -> WeightFormat {
    WeightFormat {
        id,
        suffix,
        block,
        chunk,
    }
}

/// Every format the kernels read. The last with a chunk decoder is the chunk dispatch's
/// `default` (a switch with no path that returns nothing).
pub const WEIGHT_FORMATS: [WeightFormat; 12] = [
    format(0, "f32", Some("F32"), None),
    format(1, "f16", Some("F16"), None),
    format(30, "bf16", Some("BF16"), None),
    format(2, "q4_0", Some("Q4_0"), Some("ChunkQ4_0")),
    format(3, "q4_1", Some("Q4_1"), Some("ChunkQ4_1")),
    format(6, "q5_0", Some("Q5_0"), Some("ChunkQ5_0")),
    format(7, "q5_1", Some("Q5_1"), Some("ChunkQ5_1")),
    format(8, "q8_0", Some("Q8_0"), Some("ChunkQ8_0")),
    format(12, "q4_k", Some("Q4_K"), Some("ChunkQ4_K")),
    format(13, "q5_k", Some("Q5_K"), Some("ChunkQ5_K")),
    // MXFP4 comes only as routed experts' matrices: no dense kernels.
    format(39, "mxfp4", None, Some("ChunkMXFP4")),
    format(14, "q6_k", Some("Q6_K"), Some("ChunkQ6_K")),
];

/// The format of GGUF type id `id`, if the kernels read it.
pub fn weight_format(id: u32) -> Option<&'static WeightFormat> {
    WEIGHT_FORMATS.iter().find(|f| f.id == id)
}

/// The C++ macros over [`WEIGHT_FORMATS`] the kernel files expand:
/// `LLORCH_BLOCK_FORMATS(X)` is `X(block, suffix)` for each dense format (quant.cu's kernels),
/// `LLORCH_FLOAT_FORMATS(X)` `X(block, suffix)` for each float format (quant.cu's f32 GEMVs),
/// `LLORCH_INT8_DENSE_FORMATS(X, ...)` `X(chunk, suffix, ...)` for each int8 dense format (the
/// GEMM's per-format kernels), and `LLORCH_CHUNK_SWITCH(format, CALL, ...)` a switch on a
/// format id calling `CALL(chunk, ...)` with its chunk decoder.
pub fn format_macros() -> String {
    let chunked: Vec<&WeightFormat> = WEIGHT_FORMATS.iter().filter(|f| f.chunk.is_some()).collect();
    let mut text = String::from("#define LLORCH_BLOCK_FORMATS(X)");
    for f in &WEIGHT_FORMATS {
        if let Some(block) = f.block {
            text.push_str(&format!(" X({block}, {})", f.suffix));
        }
    }
    text.push_str("\n#define LLORCH_FLOAT_FORMATS(X)");
    for f in WEIGHT_FORMATS.iter().filter(|f| f.float_dense()) {
        let block = f.block.unwrap_or_default();
        text.push_str(&format!(" X({block}, {})", f.suffix));
    }
    text.push_str("\n#define LLORCH_INT8_DENSE_FORMATS(X, ...)");
    for f in WEIGHT_FORMATS.iter().filter(|f| f.int8_dense()) {
        let chunk = f.chunk.unwrap_or_default();
        text.push_str(&format!(" X({chunk}, {}, __VA_ARGS__)", f.suffix));
    }
    text.push_str("\n#define LLORCH_CHUNK_SWITCH(format, CALL, ...) switch (format) {");
    for (i, f) in chunked.iter().enumerate() {
        let chunk = f.chunk.unwrap_or_default();
        let label = if i + 1 == chunked.len() {
            "default".to_owned()
        } else {
            format!("case {}", f.id)
        };
        text.push_str(&format!(" {label}: CALL({chunk}, __VA_ARGS__); break;"));
    }
    text.push_str(" }\n");
    text
}
