// Shared helpers of every kernel file. The files are concatenated into one NVRTC program
// (backend-cuda/src/module.rs), so this comes first and no CUDA header is needed: f16
// conversions are single PTX instructions.
//
// The program is compiled with --fmad=false: products and sums are rounded as written, like the
// CPU backend's Rust, and fused multiply-adds appear only where a kernel asks for fmaf.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;

__device__ __forceinline__ float h2f(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// Round to nearest even, as half::f16::from_f32.
__device__ __forceinline__ u16 f2h(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float ld_f16(const u8* p) { return h2f(*(const u16*)p); }

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// 1 / rms(row) for RMSNorm, one order whatever the block (rms_norm, the f32 GEMVs and the
// quantized launches' inputs all call it, so a row normalized by any of them has the same
// bits): the squares (f32 products, summed in f64) of elements i ≡ v (mod NORM_THREADS) summed
// in order by "virtual thread" v, each warp's 32 by the xor butterfly, the NORM_THREADS / 32
// warps' totals in order. A block of B threads (B dividing NORM_THREADS) plays NORM_THREADS / B
// virtual threads a thread. Called by every thread of the block; returns the same to all.
__device__ float rms_scale(const float* row, int cols, float eps) {
    __shared__ double partial[NORM_THREADS / 32];
    for (int v = threadIdx.x; v < NORM_THREADS; v += blockDim.x) {
        double squares = 0.0;
#pragma unroll 4
        for (int i = v; i < cols; i += NORM_THREADS) {
            float x = row[i];
            squares += (double)(x * x);
        }
        for (int o = 16; o > 0; o >>= 1) squares += __shfl_xor_sync(0xffffffffu, squares, o);
        if ((v & 31) == 0) partial[v >> 5] = squares;
    }
    __syncthreads();
    double total = partial[0];
    for (int w = 1; w < NORM_THREADS / 32; ++w) total += partial[w];
    // Every thread has read `partial` before a later call of the block writes it.
    __syncthreads();
    return 1.0f / sqrtf((float)(total / (double)cols) + eps);
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// 2- and 4-byte loads at offsets the block layouts guarantee to be that aligned.
__device__ __forceinline__ u32 ld_u16(const u8* p) { return *(const u16*)p; }
__device__ __forceinline__ u32 ld_u32(const u8* p) { return *(const u32*)p; }
// Four bytes at a 2-byte aligned offset (blocks of 18, 22, 34 or 210 bytes).
__device__ __forceinline__ u32 ld_u32_2(const u8* p) { return ld_u16(p) | (ld_u16(p + 2) << 16); }

// N words (4N bytes, N a multiple of 4) at a 2-byte aligned offset, by 16-byte loads of the
// aligned words that hold them (never one past the aligned word of their last byte): three
// loads for eight words where 2-byte loads took sixteen, which made the load pipe, not DRAM,
// the wall of the 210-byte Q6_K blocks. The words come out by selects and funnel shifts.
template <int N>
__device__ __forceinline__ void ld_words_2(const u8* p, u32* out) {
    constexpr int V = N / 4 + 1;  // 16-byte words that hold 4N bytes at any offset
    unsigned long long address = (unsigned long long)p;
    const uint4* base = (const uint4*)(address & ~15ull);
    int lead = (int)(address & 15), q = lead >> 2, shift = 8 * (lead & 3);
    u32 v[4 * V];
#pragma unroll
    for (int i = 0; i < V; ++i) {
        // The last word holds none of the bytes when they start aligned.
        uint4 x = i < V - 1 || lead != 0 ? base[i] : make_uint4(0u, 0u, 0u, 0u);
        v[4 * i] = x.x;
        v[4 * i + 1] = x.y;
        v[4 * i + 2] = x.z;
        v[4 * i + 3] = x.w;
    }
    u32 from[N + 1];
#pragma unroll
    for (int i = 0; i <= N; ++i)
        from[i] = q == 0 ? v[i] : q == 1 ? v[i + 1] : q == 2 ? v[i + 2] : v[i + 3];
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = __funnelshift_r(from[i], from[i + 1], shift);
}

// 16- and 8-byte float loads (activation rows start at multiples of 32 elements).
struct alignas(16) F4 {
    float x, y, z, w;
};
struct alignas(16) U4 {
    u32 x, y, z, w;
};
struct alignas(8) F2 {
    float x, y;
};
__device__ __forceinline__ F4 ld_f4(const float* p) { return *(const F4*)p; }
__device__ __forceinline__ F2 ld_f2(const float* p) { return *(const F2*)p; }

// PAGE_SIZE, positions per KV page, and the other constants the Rust side shares (GEMV_WARPS,
// QG_WARPS, QG_SEG, QG_MAX_SEGMENTS, ATT_CHUNK, MAX_HEAD) are defined once, in
// src/program.rs, and passed as -D; the kernels' parameter structs (StepRows, QMatrix, QRope,
// the *Params) are defined once, in src/params.rs, whose C++ definitions open the program
// (before this file).

// The row of position p in the KV pool: page pages[p / PAGE_SIZE] of the sequence's page
// table, slot p % PAGE_SIZE. Every kernel that reads or writes keys and values goes through it.
__device__ __forceinline__ long long kv_row(const int* pages, int p) {
    return (long long)pages[(unsigned)p / PAGE_SIZE] * PAGE_SIZE + (unsigned)p % PAGE_SIZE;
}

// Where the token rows of a pass sit (`StepRows`, read from device memory, so that a captured
// pass can be replayed for other sequences and positions): the KV row of row t at position p.
// The rows of one chunk share a table; a batch of decodes has one row per sequence.
__device__ __forceinline__ long long step_kv_row(const StepRows& rows, int t, int p) {
    return kv_row(rows.pages + rows.tables[t], p);
}

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

// ggml's GELU_FP16 table: the input and the result rounded to f16.
__device__ __forceinline__ float gelu_tanh(float x) {
    const float SQRT_2_OVER_PI = 0.7978846f, COEF_A = 0.044715f;
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return x;
    x = h2f(f2h(x));
    float y = 0.5f * x * (1.0f + tanhf(SQRT_2_OVER_PI * x * (1.0f + COEF_A * x * x)));
    return h2f(f2h(y));
}

// The angle of RoPE pair i at position p, as the CPU backend's rope_angles: the power of
// theta_scale multiplied up i times in f32, divided by factors[i] (when not null), times
// freq_scale; with YaRN (yarn_high >= 0) blended with the undivided-by-freq_scale angle by the
// ramp mix = 1 - clamp((i - low) / max(0.001, high - low), 0, 1).
__device__ __forceinline__ float rope_angle(int p, int i, float theta_scale, float freq_scale,
                                            const float* factors, float yarn_low,
                                            float yarn_high) {
    float theta = (float)p;
    for (int j = 0; j < i; ++j) theta *= theta_scale;
    if (factors) theta = theta / factors[i];
    float interpolated = freq_scale * theta;
    if (yarn_high < 0.0f) return interpolated;
    float y = ((float)i - yarn_low) / fmaxf(yarn_high - yarn_low, 0.001f);
    float mix = 1.0f - fminf(fmaxf(y, 0.0f), 1.0f);
    return interpolated * (1.0f - mix) + theta * mix;
}
