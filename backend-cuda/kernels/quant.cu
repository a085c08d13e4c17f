// Weight formats: one element of a row at a time, with the operations (and rounding) of the
// CPU backend's reference dequantizers (ggml's dequantize_row_*), then the kernels built on
// them: dequantize (prefill's cuBLAS path and embedding lookups) and GEMV (decode).
//
// Block layouts are ggml-common.h's; every f16 field sits at an even offset of an even-sized
// block, and each tensor has its own allocation, so 2-byte loads are aligned.

struct F32 {
    static __device__ __forceinline__ float at(const u8* row, int c) { return ((const float*)row)[c]; }
};

struct F16 {
    static __device__ __forceinline__ float at(const u8* row, int c) { return ld_f16(row + 2 * c); }
};

struct BF16 {
    // A 16-bit shift, as ggml (a conversion instruction could quiet signalling NaNs).
    static __device__ __forceinline__ float at(const u8* row, int c) {
        return __uint_as_float((u32)((const u16*)row)[c] << 16);
    }
};

struct Q4_0 {  // d: f16, qs[16]
    static __device__ __forceinline__ float at(const u8* row, int c) {
        const u8* b = row + (c >> 5) * 18;
        int j = c & 31;
        int q = j < 16 ? (b[2 + j] & 15) : (b[2 + j - 16] >> 4);
        return (float)(q - 8) * ld_f16(b);
    }
};

struct Q4_1 {  // d, m: f16, qs[16]
    static __device__ __forceinline__ float at(const u8* row, int c) {
        const u8* b = row + (c >> 5) * 20;
        int j = c & 31;
        int q = j < 16 ? (b[4 + j] & 15) : (b[4 + j - 16] >> 4);
        return fmaf((float)q, ld_f16(b), ld_f16(b + 2));
    }
};

__device__ __forceinline__ int q5_quant(const u8* qh4, const u8* qs, int j) {
    u32 qh = (u32)qh4[0] | ((u32)qh4[1] << 8) | ((u32)qh4[2] << 16) | ((u32)qh4[3] << 24);
    if (j < 16) return (qs[j] & 15) | (((qh >> j) << 4) & 0x10);
    return (qs[j - 16] >> 4) | ((qh >> (j - 4)) & 0x10);
}

struct Q5_0 {  // d: f16, qh[4], qs[16]
    static __device__ __forceinline__ float at(const u8* row, int c) {
        const u8* b = row + (c >> 5) * 22;
        return (float)(q5_quant(b + 2, b + 6, c & 31) - 16) * ld_f16(b);
    }
};

struct Q5_1 {  // d, m: f16, qh[4], qs[16]
    static __device__ __forceinline__ float at(const u8* row, int c) {
        const u8* b = row + (c >> 5) * 24;
        return fmaf((float)q5_quant(b + 4, b + 8, c & 31), ld_f16(b), ld_f16(b + 2));
    }
};

struct Q8_0 {  // d: f16, qs[32] signed
    static __device__ __forceinline__ float at(const u8* row, int c) {
        const u8* b = row + (c >> 5) * 34;
        return (float)(signed char)b[2 + (c & 31)] * ld_f16(b);
    }
};

// ggml's get_scale_min_k4: 6-bit scale and min of sub-block j (0..8) packed in 12 bytes.
__device__ __forceinline__ void scale_min_k4(int j, const u8* s, int* sc, int* m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

struct Q4_K {  // d, dmin: f16, scales[12], qs[128]
    static __device__ __forceinline__ float at(const u8* row, int c) {
        const u8* b = row + (c >> 8) * 144;
        int e = c & 255, j = e >> 5, l = e & 31;
        int sc, m;
        scale_min_k4(j, b + 4, &sc, &m);
        u8 byte = b[16 + 32 * (j >> 1) + l];
        int q = (j & 1) ? (byte >> 4) : (byte & 15);
        float d1 = ld_f16(b) * (float)sc, m1 = ld_f16(b + 2) * (float)m;
        return d1 * (float)q - m1;
    }
};

struct Q5_K {  // d, dmin: f16, scales[12], qh[32], qs[128]
    static __device__ __forceinline__ float at(const u8* row, int c) {
        const u8* b = row + (c >> 8) * 176;
        int e = c & 255, j = e >> 5, l = e & 31;
        int sc, m;
        scale_min_k4(j, b + 4, &sc, &m);
        u8 byte = b[48 + 32 * (j >> 1) + l];
        int q = ((j & 1) ? (byte >> 4) : (byte & 15)) + (((b[16 + l] >> j) & 1) << 4);
        float d1 = ld_f16(b) * (float)sc, m1 = ld_f16(b + 2) * (float)m;
        return d1 * (float)q - m1;
    }
};

struct Q6_K {  // ql[128], qh[64], scales[16] signed, d: f16
    static __device__ __forceinline__ float at(const u8* row, int c) {
        const u8* b = row + (c >> 8) * 210;
        int e = c & 255, n = e >> 7, r = e & 127, g = r >> 5, l = r & 31;
        u8 lo = b[64 * n + l + 32 * (g & 1)];
        int nib = g >= 2 ? (lo >> 4) : (lo & 15);
        int hi = (b[128 + 32 * n + l] >> (2 * g)) & 3;
        int q = (nib | (hi << 4)) - 32;
        float sc = (float)(signed char)b[192 + 8 * n + (l >> 4) + 2 * g];
        return ld_f16(b + 208) * sc * (float)q;
    }
};

// out[r][c] = W[ids ? ids[r] : r][c] * scale, f32, r < rows.
template <typename T>
__device__ void dequant(const u8* w, int rows, int cols, long long row_bytes, const u32* ids,
                        float scale, float* out) {
    long long total = (long long)rows * cols;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        long long r = i / cols;
        int c = (int)(i - r * cols);
        long long src = ids ? (long long)ids[r] : r;
        out[i] = T::at(w + src * row_bytes, c) * scale;
    }
}

// One lane's share of Σ_c W[row][c] · x[c] (summed over the warp by the caller). The weights
// take the values `at` gives, rounded the same way; only the order of the sum differs. Lanes on
// consecutive elements, each dequantized on its own. This is the decode path of the formats
// without an int8-activation GEMV (F32, F16, BF16, Q5_K; qgemv.cu has the others) and of a
// launch mixing such a format with quantized ones, so it is kept plain rather than tuned per
// format.
template <typename T>
__device__ __forceinline__ float row_dot(const u8* row, const float* x, int cols, int lane) {
    float acc0 = 0.0f, acc1 = 0.0f;
    int c = lane;
    for (; c + 32 < cols; c += 64) {
        acc0 = fmaf(T::at(row, c), x[c], acc0);
        acc1 = fmaf(T::at(row, c + 32), x[c + 32], acc1);
    }
    if (c < cols) acc0 = fmaf(T::at(row, c), x[c], acc0);
    return acc0 + acc1;
}

// GEMV_WARPS (warps per block of the GEMV kernels) comes from src/program.rs.

// The input row of token blockIdx.y, RMS-normalized into shared memory when `norm` is given
// (as rms_norm in ops.cu computes it: f64 sum of squares, then (x · scale) · w), so that a GEMV
// takes the residual stream itself: each block redoes this short pass instead of a launch of
// its own. Called by every thread of the block (`norm` is the same for all).
__device__ const float* gemv_input(const float* x, const float* norm, int cols, float eps) {
    extern __shared__ F4 s_input[];
    __shared__ double partial[GEMV_WARPS];
    const float* row = x + (long long)blockIdx.y * cols;
    if (!norm) return row;
    double sum = 0.0;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        float v = row[i];
        sum += (double)(v * v);
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = sum;
    __syncthreads();
    sum = partial[0];
    for (int w = 1; w < GEMV_WARPS; ++w) sum += partial[w];
    float mean = (float)(sum / (double)cols);
    float scale = 1.0f / sqrtf(mean + eps);
    float* out = (float*)s_input;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) out[i] = (row[i] * scale) * norm[i];
    __syncthreads();
    return out;
}

// Rows of up to three matrices of one format and width that read the same input (Q, K and V):
// `parts` warps (1, 2 or 4) per output row, each on a contiguous run of the row's whole blocks
// of `block_elems` elements, so that a long row is not one warp's chain of loads; grid.x over
// the rows of all three, grid.y over tokens. Optional per-matrix bias and input RMSNorm; with
// `accumulate` the result is added to y (the residual) instead of stored.
template <typename T>
__device__ void gemv(const u8* w0, const u8* w1, const u8* w2, int rows0, int rows1, int rows2,
                     int cols, long long row_bytes, int block_elems, int parts, const float* x,
                     const float* norm, float eps, const float* b0, const float* b1,
                     const float* b2, float* y0, float* y1, float* y2, int accumulate) {
    __shared__ float s_part[GEMV_WARPS];
    const float* xt = gemv_input(x, norm, cols, eps);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, part = warp % parts;
    int row = blockIdx.x * (GEMV_WARPS / parts) + warp / parts;
    const u8* w = w0;
    const float* bias = b0;
    float* y = y0;
    int rows = rows0;
    if (row >= rows0) {
        row -= rows0;
        w = w1, bias = b1, y = y1, rows = rows1;
        if (row >= rows1) {
            row -= rows1;
            w = w2, bias = b2, y = y2, rows = rows2;
        }
    }
    bool valid = row < rows;
    int nb = cols / block_elems, first = nb * part / parts, last = nb * (part + 1) / parts;
    long long block_bytes = row_bytes / nb;
    float acc = 0.0f;
    if (valid)
        acc = warp_sum(row_dot<T>(w + row * row_bytes + first * block_bytes,
                                  xt + first * block_elems, (last - first) * block_elems, lane));
    if (parts > 1) {
        if (lane == 0) s_part[warp] = acc;
        __syncthreads();
        acc = s_part[warp];
        for (int i = 1; i < parts; ++i) acc += s_part[warp + i];
    }
    if (valid && part == 0 && lane == 0) {
        if (bias) acc = acc + bias[row];
        float* dst = y + (long long)blockIdx.y * rows + row;
        *dst = accumulate ? *dst + acc : acc;
    }
}

// out[t][r] = act(gate[r] · x[t]) · (up[r] · x[t]), so the gate's activation needs no pass of its
// own: with `split` the gate row in an even warp and the up row in the next (two rows per
// block, the dot products side by side), else both in one warp (when twice the warps would not
// all fit on the GPU at once); optional input RMSNorm as gemv's.
template <typename T>
__device__ void gemv_gated(const u8* gate, const u8* up, int rows, int cols, long long row_bytes,
                           const float* x, const float* norm, float eps, int split, float* out,
                           int use_gelu) {
    __shared__ float s_dot[GEMV_WARPS];
    const float* xt = gemv_input(x, norm, cols, eps);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int row = split ? blockIdx.x * (GEMV_WARPS / 2) + (warp >> 1) : blockIdx.x * GEMV_WARPS + warp;
    bool valid = row < rows, is_up = split && (warp & 1);
    float g = 0.0f, u = 0.0f;
    if (valid) g = warp_sum(row_dot<T>((is_up ? up : gate) + row * row_bytes, xt, cols, lane));
    if (split) {
        if (lane == 0) s_dot[warp] = g;
        __syncthreads();
        u = s_dot[warp | 1];
    } else if (valid) {
        u = warp_sum(row_dot<T>(up + row * row_bytes, xt, cols, lane));
    }
    if (valid && !is_up && lane == 0)
        out[(long long)blockIdx.y * rows + row] = (use_gelu ? gelu_tanh(g) : silu(g)) * u;
}

#define WEIGHT_KERNELS(T, name)                                                                 \
    extern "C" __global__ void dequant_##name(const __grid_constant__ DequantParams p) {                          \
        dequant<T>(p.w, p.rows, p.cols, p.row_bytes, p.ids, p.scale, p.out);                    \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32) gemv_##name(                  \
        const __grid_constant__ GemvParams p) {                                                 \
        gemv<T>(p.w0, p.w1, p.w2, p.rows0, p.rows1, p.rows2, p.cols, p.row_bytes, p.block_elems, \
                p.parts, p.x, p.norm, p.eps, p.b0, p.b1, p.b2, p.y0, p.y1, p.y2, p.accumulate);  \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32) gemv_gated_##name(            \
        const __grid_constant__ GemvGatedParams p) {                                            \
        gemv_gated<T>(p.gate, p.up, p.rows, p.cols, p.row_bytes, p.x, p.norm, p.eps, p.split,   \
                      p.out, p.use_gelu);                                                       \
    }

// Each dense format of src/formats.rs, with its block decoder above.
LLORCH_BLOCK_FORMATS(WEIGHT_KERNELS)
