// The kernels' parameters: each kernel takes one of the structs below by value, and each is
// defined here alone. `kernel_params!` makes the `#[repr(C)]` Rust struct and its C definition
// from one declaration, and the program (`program::source`) begins with those definitions, so
// the launches and the kernels read one layout (`include!`d by program.rs, hence by build.rs:
// `std` only, no inner doc comment).

use std::marker::PhantomData;

/// A device address of `T` elements, a kernel's `T*`: offsets are counted in elements, so no
/// launch does byte arithmetic on an address it did not make.
#[repr(transparent)]
pub struct DevPtr<T> {
    addr: u64,
    element: PhantomData<fn() -> T>,
}

impl<T> Clone for DevPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for DevPtr<T> {}

impl<T> PartialEq for DevPtr<T> {
    fn eq(&self, other: &Self) -> bool {
        self.addr == other.addr
    }
}

impl<T> std::fmt::Debug for DevPtr<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DevPtr({:#x})", self.addr)
    }
}

impl<T> Default for DevPtr<T> {
    fn default() -> Self {
        Self::NULL
    }
}

#[allow(dead_code)]
impl<T> DevPtr<T> {
    /// The null address: a kernel's "none" for an optional input (a bias, a norm, a mask).
    pub const NULL: Self = Self {
        addr: 0,
        element: PhantomData,
    };

    /// The address `addr`, which must hold `T`s (only the allocator and the tests make one).
    pub fn from_addr(addr: u64) -> Self {
        Self {
            addr,
            element: PhantomData,
        }
    }

    /// The raw address, for the driver calls that take one.
    pub fn addr(self) -> u64 {
        self.addr
    }

    /// The address `elements` elements on.
    pub fn offset(self, elements: usize) -> Self {
        Self::from_addr(self.addr + (elements * std::mem::size_of::<T>()) as u64)
    }

    /// The same address read as elements of `U` (a buffer of bytes holding floats, say).
    pub fn cast<U>(self) -> DevPtr<U> {
        DevPtr::from_addr(self.addr)
    }

    /// `Some(self)`, or `None` for the null address.
    pub fn non_null(self) -> Option<Self> {
        (self.addr != 0).then_some(self)
    }
}

/// A type as the kernels' C++ names it.
pub trait CType {
    /// Its C++ name.
    fn c_name() -> String;
}

macro_rules! c_scalars {
    ($($rust:ty => $c:literal),*) => {
        $(impl CType for $rust {
            fn c_name() -> String {
                $c.to_owned()
            }
        })*
    };
}

// The unsigned types by their C names: the definitions come before prelude.cu's typedefs.
c_scalars!(
    u8 => "unsigned char",
    u16 => "unsigned short",
    u32 => "unsigned int",
    i32 => "int",
    i64 => "long long",
    f32 => "float"
);

impl<T: CType> CType for DevPtr<T> {
    fn c_name() -> String {
        format!("{}*", T::c_name())
    }
}

/// A kernel's parameters: one of the structs below, which a launch passes by value
/// (`Gpu::launch`).
pub trait KernelParams: Copy + CType {}

/// A kernel of one pointer parameter takes the address itself.
impl<T: CType> KernelParams for DevPtr<T> {}

/// Declares parameter structs: each a `#[repr(C)]` Rust struct and, in [`param_definitions`],
/// its C++ definition, field for field (a struct used as a field must come before its user).
macro_rules! kernel_params {
    ($($(#[$meta:meta])* pub struct $name:ident { $($(#[$field_meta:meta])* pub $field:ident: $ty:ty,)* })*) => {
        $(
            $(#[$meta])*
            #[repr(C)]
            #[derive(Debug, Clone, Copy, PartialEq, Default)]
            pub struct $name {
                $($(#[$field_meta])* pub $field: $ty,)*
            }

            impl CType for $name {
                fn c_name() -> String {
                    stringify!($name).to_owned()
                }
            }

            impl KernelParams for $name {}
        )*

        /// The C++ definitions of every parameter struct, in declaration order.
        pub fn param_definitions() -> String {
            let mut text = String::new();
            $(
                text.push_str(concat!("struct ", stringify!($name), " {\n"));
                $(text.push_str(&format!("    {} {};\n", <$ty as CType>::c_name(), stringify!($field)));)*
                text.push_str("};\n");
            )*
            text
        }
    };
}

kernel_params! {
    /// Where the token rows of a pass sit: row `t` is at position `pos[t]` of the sequence
    /// whose page table starts at entry `tables[t]` of `pages` (the pass's tables, one after
    /// the other, as `int` page ids).
    pub struct StepRows {
        /// Each row's position.
        pub pos: DevPtr<i32>,
        /// Each row's offset of its page table in `pages`.
        pub tables: DevPtr<i32>,
        /// The pass's page tables.
        pub pages: DevPtr<i32>,
    }

    /// One matrix of a quantized launch (`qgemv`, `qgemm`): `rows` rows of `row_bytes` in
    /// format `format` (the GGUF type id), products to `y`, plus `bias` when not null.
    pub struct QMatrix {
        /// Row 0 of the weights.
        pub w: DevPtr<u8>,
        /// Bytes per row.
        pub row_bytes: i64,
        /// f32 bias of `rows`, or null.
        pub bias: DevPtr<f32>,
        /// Output rows (`rows` floats per token).
        pub y: DevPtr<f32>,
        /// Output features (0: no matrix).
        pub rows: i32,
        /// GGUF type id.
        pub format: i32,
    }

    /// How a RoPE launch rotates and where it stores the keys and values (rope_store's, and
    /// the quantized launches' RoPE epilogue).
    pub struct QRope {
        /// The rows' positions and page tables.
        pub rows: StepRows,
        /// This layer's key pool (f16).
        pub k_cache: DevPtr<u16>,
        /// This layer's value pool (f16).
        pub v_cache: DevPtr<u16>,
        /// Query/key head width.
        pub head_dim: i32,
        /// Rotated elements of a head.
        pub dims: i32,
        /// 1: NEOX pairs (i, i + dims/2); 0: (2i, 2i + 1).
        pub neox: i32,
        /// RoPE's θ step.
        pub theta_scale: f32,
        /// Its frequency scale.
        pub freq_scale: f32,
        /// Per-pair divisors of the angle, or null.
        pub factors: DevPtr<f32>,
        /// Multiplies cos and sin (ggml's mscale).
        pub attn_factor: f32,
        /// YaRN's ramp start (rope_angle).
        pub yarn_low: f32,
        /// Its end; negative: no YaRN.
        pub yarn_high: f32,
    }

    /// `qgemv_*`: up to three matrices of one width times `n` input rows (`x`, through `norm`
    /// when not null, or `pre` quantized once), as `mode` says (qgemv.cu's `QG_*`).
    pub struct QgemvParams {
        /// The first matrix.
        pub m0: QMatrix,
        /// The second (rows 0: none).
        pub m1: QMatrix,
        /// The third (rows 0: none).
        pub m2: QMatrix,
        /// The RoPE epilogue's rotation and pools.
        pub rope: QRope,
        /// Input width.
        pub cols: i32,
        /// Input rows.
        pub n: i32,
        /// f32 input rows, or null with `pre`.
        pub x: DevPtr<f32>,
        /// The input rows quantized by `quantize_rows`, or null.
        pub pre: DevPtr<u8>,
        /// RMSNorm weights applied to `x`, or null.
        pub norm: DevPtr<f32>,
        /// The norm's epsilon.
        pub eps: f32,
        /// `QG_*`.
        pub mode: i32,
    }

    /// `qgemm_*`: the tensor-core GEMM of up to three matrices over `n` quantized rows.
    pub struct QgemmParams {
        /// The first matrix.
        pub m0: QMatrix,
        /// The second (rows 0: none).
        pub m1: QMatrix,
        /// The third (rows 0: none).
        pub m2: QMatrix,
        /// The RoPE epilogue's rotation and pools.
        pub rope: QRope,
        /// Input width.
        pub cols: i32,
        /// Input rows.
        pub n: i32,
        /// The rows quantized by `quantize_rows`.
        pub pre: DevPtr<u8>,
        /// `QG_*`.
        pub mode: i32,
        /// Segment totals of a launch split along the inputs, or null.
        pub partial: DevPtr<f32>,
        /// Finished segments per tile (zeroed), or null.
        pub counters: DevPtr<u32>,
    }

    /// `quantize_rows`: `x`'s rows (through `norm` when not null) as int8 chunks into `out`.
    pub struct QuantizeParams {
        /// f32 rows of `cols`.
        pub x: DevPtr<f32>,
        /// RMSNorm weights, or null.
        pub norm: DevPtr<f32>,
        /// The norm's epsilon.
        pub eps: f32,
        /// Row width.
        pub cols: i32,
        /// Quantized rows, `qinput_bytes(cols)` apart.
        pub out: DevPtr<u8>,
    }

    /// `dequant_*`: rows `ids[r]` (or `r` when null) of `w` times `scale`, as f32 rows.
    pub struct DequantParams {
        /// Row 0 of the weights.
        pub w: DevPtr<u8>,
        /// Rows out.
        pub rows: i32,
        /// Elements a row.
        pub cols: i32,
        /// Bytes per weight row.
        pub row_bytes: i64,
        /// The rows to take, or null.
        pub ids: DevPtr<u32>,
        /// Multiplies every element.
        pub scale: f32,
        /// f32 rows of `cols`.
        pub out: DevPtr<f32>,
    }

    /// `gemv_*` (float formats, f32 arithmetic): up to three matrices of one format and width.
    pub struct GemvParams {
        /// The matrices' rows 0 (null: none).
        pub w0: DevPtr<u8>,
        /// See `w0`.
        pub w1: DevPtr<u8>,
        /// See `w0`.
        pub w2: DevPtr<u8>,
        /// Their rows.
        pub rows0: i32,
        /// See `rows0`.
        pub rows1: i32,
        /// See `rows0`.
        pub rows2: i32,
        /// Input width.
        pub cols: i32,
        /// Bytes per row (the same for the three).
        pub row_bytes: i64,
        /// Warps per row, one piece each (`float_parts`).
        pub parts: i32,
        /// f32 input rows.
        pub x: DevPtr<f32>,
        /// RMSNorm weights applied to `x`, or null.
        pub norm: DevPtr<f32>,
        /// The norm's epsilon.
        pub eps: f32,
        /// Biases (null: none).
        pub b0: DevPtr<f32>,
        /// See `b0`.
        pub b1: DevPtr<f32>,
        /// See `b0`.
        pub b2: DevPtr<f32>,
        /// Outputs.
        pub y0: DevPtr<f32>,
        /// See `y0`.
        pub y1: DevPtr<f32>,
        /// See `y0`.
        pub y2: DevPtr<f32>,
        /// 1: add to the outputs.
        pub accumulate: i32,
    }

    /// `fgemm_*` (float formats): one matrix by `n` normalized input rows, THE FLOAT ORDER of
    /// quant.cu as the GEMV's.
    pub struct FgemmParams {
        /// Row 0 of the weights.
        pub w: DevPtr<u8>,
        /// Weight rows.
        pub rows: i32,
        /// Input width.
        pub cols: i32,
        /// Bytes per weight row.
        pub row_bytes: i64,
        /// Pieces a row is summed in (`float_parts`).
        pub parts: i32,
        /// Input rows.
        pub n: i32,
        /// f32 input rows of `cols`.
        pub x: DevPtr<f32>,
        /// Per-row bias, or null.
        pub bias: DevPtr<f32>,
        /// Output rows of `rows`.
        pub out: DevPtr<f32>,
        /// 1: added to `out` (the residual), 0: stored.
        pub accumulate: i32,
    }

    /// `gemv_gated_*`: `out = act(gate · x) · (up · x)`.
    pub struct GemvGatedParams {
        /// Gate rows.
        pub gate: DevPtr<u8>,
        /// Up rows, shaped as `gate`.
        pub up: DevPtr<u8>,
        /// Rows of each.
        pub rows: i32,
        /// Input width.
        pub cols: i32,
        /// Bytes per row.
        pub row_bytes: i64,
        /// f32 input rows.
        pub x: DevPtr<f32>,
        /// RMSNorm weights applied to `x`, or null.
        pub norm: DevPtr<f32>,
        /// The norm's epsilon.
        pub eps: f32,
        /// 1: gate and up rows in warps of their own.
        pub split: i32,
        /// Output rows.
        pub out: DevPtr<f32>,
        /// 1: GELU, 0: SiLU.
        pub use_gelu: i32,
    }

    /// `rms_norm`: each row of `x` into `out` (which may be `x`).
    pub struct RmsNormParams {
        /// Input rows.
        pub x: DevPtr<f32>,
        /// Norm weights.
        pub w: DevPtr<f32>,
        /// Output rows.
        pub out: DevPtr<f32>,
        /// Row width.
        pub width: i32,
        /// Epsilon.
        pub eps: f32,
    }

    /// `rope_store`: RoPE of the rows' query and key heads in place, then their keys and
    /// values into the pool.
    pub struct RopeStoreParams {
        /// Query rows, rotated in place.
        pub q: DevPtr<f32>,
        /// Key rows, rotated in place, then stored.
        pub k: DevPtr<f32>,
        /// Value rows, stored.
        pub v: DevPtr<f32>,
        /// The rotation, the rows and the pools.
        pub rope: QRope,
        /// Query heads.
        pub n_head: i32,
        /// Key/value heads.
        pub n_head_kv: i32,
        /// Value row width.
        pub v_width: i32,
    }

    /// `add`, `softcap`: element-wise over `total` floats of `x`.
    pub struct ElementwiseParams {
        /// Updated in place.
        pub x: DevPtr<f32>,
        /// The other operand (`add`), or null.
        pub y: DevPtr<f32>,
        /// `softcap`'s cap.
        pub cap: f32,
        /// Elements.
        pub total: i64,
    }

    /// `gated`: `out = act(gate) · up` for `rows` rows of `width`, inputs `stride` apart.
    pub struct GatedParams {
        /// Gate rows.
        pub gate: DevPtr<f32>,
        /// Up rows.
        pub up: DevPtr<f32>,
        /// Output rows of `width`.
        pub out: DevPtr<f32>,
        /// Elements out per row.
        pub width: i32,
        /// Elements between input rows.
        pub stride: i32,
        /// Rows.
        pub rows: i32,
        /// 1: GELU, 0: SiLU.
        pub use_gelu: i32,
    }

    /// `copy_cols`: columns `offset..offset + width` of each `src_stride`-wide row into `dst`;
    /// `gather_rows`: `dst[i] = src[ids[i]]` for `rows` rows of `width`.
    pub struct CopyParams {
        /// Source rows.
        pub src: DevPtr<f32>,
        /// `gather_rows`' row ids, or null.
        pub ids: DevPtr<i32>,
        /// Elements between source rows (`copy_cols`).
        pub src_stride: i32,
        /// First column (`copy_cols`).
        pub offset: i32,
        /// Destination rows of `width`.
        pub dst: DevPtr<f32>,
        /// Elements per row out.
        pub width: i32,
        /// Rows out.
        pub rows: i32,
    }

    /// `argmax_logits`: the greedy choice of each of grid.y rows of `n` logits.
    pub struct ArgmaxParams {
        /// Logit rows.
        pub logits: DevPtr<f32>,
        /// Logits per row.
        pub n: i32,
        /// Each row's choice.
        pub out: DevPtr<u32>,
        /// Per row and block (value, index) pairs.
        pub partial: DevPtr<f32>,
        /// Per row finished blocks (zeroed; left zeroed).
        pub counter: DevPtr<u32>,
        /// Per row bitsets of allowed ids, or null.
        pub allowed: DevPtr<u32>,
        /// Words per row of `allowed`.
        pub allowed_words: i32,
    }

    /// `attention_h*` (a pass of long chunks) and `attention_split` (decodes).
    pub struct AttentionParams {
        /// Query rows (`n_head · dk` per row).
        pub q: DevPtr<f32>,
        /// This layer's key pool (f16).
        pub k_cache: DevPtr<u16>,
        /// This layer's value pool (f16).
        pub v_cache: DevPtr<u16>,
        /// The rows' positions and page tables.
        pub rows: StepRows,
        /// Output rows (`n_head · dv`).
        pub out: DevPtr<f32>,
        /// Query heads.
        pub n_head: i32,
        /// Key/value heads.
        pub n_head_kv: i32,
        /// Key head width.
        pub dk: i32,
        /// Value head width.
        pub dv: i32,
        /// Score scale.
        pub scale: f32,
        /// Sliding window (0: none).
        pub window: i32,
        /// One logit per query head joining each softmax, or null.
        pub sinks: DevPtr<f32>,
        /// Query rows.
        pub n: i32,
        /// Blocks per head (`attention_split`).
        pub splits: i32,
        /// Its partial results.
        pub partial: DevPtr<f32>,
        /// Its finished-block counts (zeroed; left zeroed).
        pub counters: DevPtr<u32>,
    }

    /// `moe_route`: each row's `used` experts of `count` and their weights.
    pub struct MoeRouteParams {
        /// Router logits, `count` a row.
        pub logits: DevPtr<f32>,
        /// Experts.
        pub count: i32,
        /// Experts per row.
        pub used: i32,
        /// Rows.
        pub n: i32,
        /// Chosen experts, `used` a row.
        pub ids: DevPtr<i32>,
        /// Their weights.
        pub weights: DevPtr<f32>,
    }

    /// `moe_group`: the `pairs` (row, expert) pairs sorted by expert.
    pub struct MoeGroupParams {
        /// Chosen experts.
        pub ids: DevPtr<i32>,
        /// Pairs.
        pub pairs: i32,
        /// Experts.
        pub count: i32,
        /// Each expert's first pair in `order`.
        pub offsets: DevPtr<i32>,
        /// Pairs in expert order.
        pub order: DevPtr<i32>,
        /// The experts with pairs, then -1.
        pub active: DevPtr<i32>,
    }

    /// `moe_gather`: each pair's quantized input row, in expert order.
    pub struct MoeGatherParams {
        /// Quantized rows.
        pub rows: DevPtr<u8>,
        /// Pairs in expert order.
        pub order: DevPtr<i32>,
        /// Experts per row.
        pub used: i32,
        /// Bytes per quantized row.
        pub bytes: i32,
        /// The gathered rows.
        pub sorted: DevPtr<u8>,
    }

    /// The routed experts' gated gate·up products (`moe_pair_gate_up`, `moe_gate_up`,
    /// `moe_gemm_gate_up`).
    pub struct MoeGateUpParams {
        /// Each expert's gate rows.
        pub gate_w: DevPtr<DevPtr<u8>>,
        /// Each expert's up rows.
        pub up_w: DevPtr<DevPtr<u8>>,
        /// Each expert's gate bias (entries may be null).
        pub gate_b: DevPtr<DevPtr<f32>>,
        /// Each expert's up bias.
        pub up_b: DevPtr<DevPtr<f32>>,
        /// Bytes per row.
        pub row_bytes: i64,
        /// Rows of each matrix.
        pub rows: i32,
        /// GGUF type id.
        pub format: i32,
        /// Input width.
        pub cols: i32,
        /// Quantized inputs: per pair (`moe_pair_*`), else gathered in expert order.
        pub input: DevPtr<u8>,
        /// Each pair's expert (`moe_pair_*`).
        pub ids: DevPtr<i32>,
        /// Each expert's first pair (grouped kernels).
        pub offsets: DevPtr<i32>,
        /// The experts with pairs (grouped kernels).
        pub active: DevPtr<i32>,
        /// The gate's activation parameter.
        pub alpha: f32,
        /// Its clamp.
        pub limit: f32,
        /// Activations, one row a pair.
        pub act: DevPtr<f32>,
    }

    /// The routed experts' down products (`moe_pair_down`, `moe_down`, `moe_gemm_down`).
    pub struct MoeDownParams {
        /// Each expert's down rows.
        pub down_w: DevPtr<DevPtr<u8>>,
        /// Each expert's down bias.
        pub down_b: DevPtr<DevPtr<f32>>,
        /// Bytes per row.
        pub row_bytes: i64,
        /// Rows.
        pub rows: i32,
        /// GGUF type id.
        pub format: i32,
        /// Input width.
        pub cols: i32,
        /// Quantized activations (per pair, or in expert order).
        pub input: DevPtr<u8>,
        /// Each pair's expert (`moe_pair_down`).
        pub ids: DevPtr<i32>,
        /// Each expert's first pair (grouped kernels).
        pub offsets: DevPtr<i32>,
        /// The experts with pairs (grouped kernels).
        pub active: DevPtr<i32>,
        /// Pairs in expert order (grouped kernels).
        pub order: DevPtr<i32>,
        /// Each pair's weight.
        pub weights: DevPtr<f32>,
        /// Per pair output rows.
        pub out: DevPtr<f32>,
    }

    /// `moe_sum`: `x[t] += Σ` of row t's `used` slots of `out`.
    pub struct MoeSumParams {
        /// Per pair rows.
        pub out: DevPtr<f32>,
        /// Experts per row.
        pub used: i32,
        /// Row width.
        pub width: i32,
        /// Rows.
        pub n: i32,
        /// The residual stream.
        pub x: DevPtr<f32>,
    }
}
