// Weight formats: one element of a row at a time, with the operations (and rounding) of the
// CPU backend's reference dequantizers (ggml's dequantize_row_*), then the kernels built on
// them: dequantize (embedding lookups, every format) and, for the float formats (F32, F16,
// BF16), the f32 GEMV and its many-row twin, which sum every output in one order (THE FLOAT
// ORDER below).
//
// Block layouts are ggml-common.h's; every f16 field sits at an even offset of an even-sized
// block, and each tensor has its own allocation, so 2-byte loads are aligned.

// The float formats also read four elements c.. c + 3 at once (`quad`, c a multiple of 4 and the
// row's bytes a multiple of the quad's: one 16- or 8-byte load), the same values `at` gives.
struct F32 {
    static __device__ __forceinline__ float at(const u8* row, int c) { return ((const float*)row)[c]; }
    static __device__ __forceinline__ void quad(const u8* row, int c, float (&v)[4]) {
        F4 q = ld_f4((const float*)row + c);
        v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
    }
};

struct F16 {
    static __device__ __forceinline__ float at(const u8* row, int c) { return ld_f16(row + 2 * c); }
    static __device__ __forceinline__ void quad(const u8* row, int c, float (&v)[4]) {
        uint2 q = *(const uint2*)(row + 2 * c);
        v[0] = h2f((u16)q.x), v[1] = h2f((u16)(q.x >> 16));
        v[2] = h2f((u16)q.y), v[3] = h2f((u16)(q.y >> 16));
    }
};

struct BF16 {
    // A 16-bit shift, as ggml (a conversion instruction could quiet signalling NaNs).
    static __device__ __forceinline__ float at(const u8* row, int c) {
        return __uint_as_float((u32)((const u16*)row)[c] << 16);
    }
    static __device__ __forceinline__ void quad(const u8* row, int c, float (&v)[4]) {
        uint2 q = *(const uint2*)(row + 2 * c);
        v[0] = __uint_as_float(q.x << 16), v[1] = __uint_as_float(q.x & 0xffff0000u);
        v[2] = __uint_as_float(q.y << 16), v[3] = __uint_as_float(q.y & 0xffff0000u);
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

// THE FLOAT ORDER. Every product of a float-format matrix by f32 activations, by the GEMV
// (`gemv_*`, `gemv_gated_*`) or by its many-row twin (`fgemm_*`), sums an output the same way:
// the row is cut into `parts` pieces of whole quads (four elements; `float_piece`; `parts` is
// `float_parts` in float.rs, a function of the launch's matrices, never of its token rows); in
// a piece, lane l of a warp takes quads l + 32j (j = 0, 1, …) and adds the quad's four products
// in element order by FMA (fmaf(w, x, acc)) into acc[j & 1], in increasing j; the lane's value
// is acc[0] + acc[1]; the 32 lanes' values are added by warp_sum's xor butterfly (16 first);
// the pieces' totals are added in order, then the epilogue (bias, residual, gate). So a row's
// bits do not depend on the kernel, the tile or the other rows (kernel test
// `float_rows_do_not_depend_on_the_kernel`). A row whose width is a multiple of 4 reads a
// quad in one load (VEC); another one element at a time, the same products.

// Elements [first, last) of piece `part` of `parts` of a row of `cols`: whole quads, the last
// piece to the row's end.
__device__ __forceinline__ void float_piece(int cols, int parts, int part, int* first, int* last) {
    int quads = (cols + 3) >> 2;
    *first = min(cols, 4 * (quads * part / parts));
    *last = min(cols, 4 * (quads * (part + 1) / parts));
}

// Lane `lane`'s values of THE FLOAT ORDER for R weight rows `w` times N input rows `x`, over
// `len` elements: out[r][t] = acc[0] + acc[1] of row r by input t. Each weight quad is read
// once for the N inputs (the twin's reuse; the GEMV takes R = N = 1). VEC: `len` and the
// pointers' element offsets are multiples of 4 (quads in one load each).
template <typename T, int R, int N, bool VEC>
__device__ __forceinline__ void lane_dots(const u8* const (&w)[R], const float* const (&x)[N],
                                          int len, int lane, float (&out)[R][N]) {
    float acc[2][R][N];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < N; ++t) acc[0][r][t] = acc[1][r][t] = 0.0f;
    for (int base = 0; base < len; base += 256) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            int c = base + 128 * j + 4 * lane;
            if (c >= len) break;
            int count = VEC ? 4 : min(4, len - c);
            float wv[R][4];
#pragma unroll
            for (int r = 0; r < R; ++r) {
                if (VEC) {
                    T::quad(w[r], c, wv[r]);
                } else {
#pragma unroll
                    for (int e = 0; e < 4; ++e) wv[r][e] = e < count ? T::at(w[r], c + e) : 0.0f;
                }
            }
#pragma unroll
            for (int t = 0; t < N; ++t) {
                float xv[4];
                if (VEC) {
                    F4 q = ld_f4(x[t] + c);
                    xv[0] = q.x, xv[1] = q.y, xv[2] = q.z, xv[3] = q.w;
                } else {
#pragma unroll
                    for (int e = 0; e < 4; ++e) xv[e] = e < count ? x[t][c + e] : 0.0f;
                }
#pragma unroll
                for (int r = 0; r < R; ++r)
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        if (e < count) acc[j][r][t] = fmaf(wv[r][e], xv[e], acc[j][r][t]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < N; ++t) out[r][t] = acc[0][r][t] + acc[1][r][t];
}

// One lane's value of THE FLOAT ORDER for one row and one input over `len` elements (summed
// over the warp by the caller); `vec` as lane_dots' VEC.
template <typename T>
__device__ __forceinline__ float row_dot(const u8* row, const float* x, int len, int lane,
                                         bool vec) {
    const u8* w[1] = {row};
    const float* xs[1] = {x};
    float out[1][1];
    if (vec) {
        lane_dots<T, 1, 1, true>(w, xs, len, lane, out);
    } else {
        lane_dots<T, 1, 1, false>(w, xs, len, lane, out);
    }
    return out[0][0];
}

// GEMV_WARPS (warps per block of the GEMV kernels) comes from src/program.rs.

// The input row of token blockIdx.y, RMS-normalized into shared memory when `norm` is given
// (rms_scale's arithmetic, as rms_norm in ops.cu), so that a GEMV takes the residual stream
// itself: each block redoes this short pass instead of a launch of its own. Called by every
// thread of the block (`norm` is the same for all).
__device__ const float* gemv_input(const float* x, const float* norm, int cols, float eps) {
    extern __shared__ F4 s_input[];
    const float* row = x + (long long)blockIdx.y * cols;
    if (!norm) return row;
    float scale = rms_scale(row, cols, eps);
    float* out = (float*)s_input;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) out[i] = (row[i] * scale) * norm[i];
    __syncthreads();
    return out;
}

// Rows of up to three matrices of one format and width that read the same input (Q, K and V):
// `parts` warps (1, 2 or 4) per output row, each on one piece of the row (`float_piece`), so
// that a long row is not one warp's chain of loads; grid.x over
// the rows of all three, grid.y over tokens. Optional per-matrix bias and input RMSNorm; with
// `accumulate` the result is added to y (the residual) instead of stored.
template <typename T>
__device__ void gemv(const u8* w0, const u8* w1, const u8* w2, int rows0, int rows1, int rows2,
                     int cols, long long row_bytes, int parts, const float* x,
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
    int first, last;
    float_piece(cols, parts, part, &first, &last);
    long long elem_bytes = row_bytes / cols;
    float acc = 0.0f;
    if (valid)
        acc = warp_sum(row_dot<T>(w + row * row_bytes + first * elem_bytes, xt + first,
                                  last - first, lane, (cols & 3) == 0));
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
    bool vec = (cols & 3) == 0;
    if (valid) g = warp_sum(row_dot<T>((is_up ? up : gate) + row * row_bytes, xt, cols, lane, vec));
    if (split) {
        if (lane == 0) s_dot[warp] = g;
        __syncthreads();
        u = s_dot[warp | 1];
    } else if (valid) {
        u = warp_sum(row_dot<T>(up + row * row_bytes, xt, cols, lane, vec));
    }
    if (valid && !is_up && lane == 0)
        out[(long long)blockIdx.y * rows + row] = (use_gelu ? gelu_tanh(g) : silu(g)) * u;
}

// The many-row twin of gemv (THE FLOAT ORDER, the same bits for every output): `out[t][r] =
// W[r] · x[t] (+ bias)`, or added to `out` with `accumulate`, for n input rows already
// normalized. A warp holds FG_ROWS weight rows × FG_TOKENS inputs, each lane its values of all
// of them, so a weight is read and dequantized once for FG_TOKENS inputs; the block's
// GEMV_WARPS warps take consecutive token groups of the same rows (their weight loads hit L1).
// Grid: x over row groups of FG_ROWS, y over token groups of GEMV_WARPS · FG_TOKENS.
template <typename T>
__device__ void fgemm(const FgemmParams& p) {
    static_assert(FG_ROWS * FG_TOKENS == 32, "one output a lane");
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int row0 = blockIdx.x * FG_ROWS, t0 = (blockIdx.y * GEMV_WARPS + warp) * FG_TOKENS;
    if (t0 >= p.n) return;  // the whole warp: no barrier follows
    long long elem_bytes = p.row_bytes / p.cols;
    const u8* w[FG_ROWS];
    const float* x[FG_TOKENS];
    float total = 0.0f;  // lane r · FG_TOKENS + t holds output (r, t)
    for (int part = 0; part < p.parts; ++part) {
        int first, last;
        float_piece(p.cols, p.parts, part, &first, &last);
#pragma unroll
        for (int r = 0; r < FG_ROWS; ++r)
            w[r] = p.w + min(row0 + r, p.rows - 1) * p.row_bytes + first * elem_bytes;
#pragma unroll
        for (int t = 0; t < FG_TOKENS; ++t)
            x[t] = p.x + (long long)min(t0 + t, p.n - 1) * p.cols + first;
        float dots[FG_ROWS][FG_TOKENS];
        if ((p.cols & 3) == 0) {
            lane_dots<T, FG_ROWS, FG_TOKENS, true>(w, x, last - first, lane, dots);
        } else {
            lane_dots<T, FG_ROWS, FG_TOKENS, false>(w, x, last - first, lane, dots);
        }
#pragma unroll
        for (int r = 0; r < FG_ROWS; ++r)
#pragma unroll
            for (int t = 0; t < FG_TOKENS; ++t) {
                float s = warp_sum(dots[r][t]);
                if (lane == r * FG_TOKENS + t) total = part == 0 ? s : total + s;
            }
    }
    int row = row0 + lane / FG_TOKENS, t = t0 + lane % FG_TOKENS;
    if (row >= p.rows || t >= p.n) return;
    float v = p.bias ? total + p.bias[row] : total;
    float* dst = p.out + (long long)t * p.rows + row;
    *dst = p.accumulate ? *dst + v : v;
}

// Every format with a block decoder: its dequantize kernel (embedding lookups).
#define DEQUANT_KERNEL(T, name)                                                                 \
    extern "C" __global__ void dequant_##name(const __grid_constant__ DequantParams p) {       \
        dequant<T>(p.w, p.rows, p.cols, p.row_bytes, p.ids, p.scale, p.out);                    \
    }

LLORCH_BLOCK_FORMATS(DEQUANT_KERNEL)

// The float formats (no int8 chunk decoder): the GEMV, the gated GEMV and the twin.
#define FLOAT_KERNELS(T, name)                                                                  \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32) gemv_##name(                  \
        const __grid_constant__ GemvParams p) {                                                 \
        gemv<T>(p.w0, p.w1, p.w2, p.rows0, p.rows1, p.rows2, p.cols, p.row_bytes, p.parts, p.x,  \
                p.norm, p.eps, p.b0, p.b1, p.b2, p.y0, p.y1, p.y2, p.accumulate);                \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32) gemv_gated_##name(            \
        const __grid_constant__ GemvGatedParams p) {                                            \
        gemv_gated<T>(p.gate, p.up, p.rows, p.cols, p.row_bytes, p.x, p.norm, p.eps, p.split,   \
                      p.out, p.use_gelu);                                                       \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32) fgemm_##name(                 \
        const __grid_constant__ FgemmParams p) {                                                \
        fgemm<T>(p);                                                                            \
    }

LLORCH_FLOAT_FORMATS(FLOAT_KERNELS)
