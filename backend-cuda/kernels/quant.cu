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

// y[t][row] = Σ_c W[row][c] · x[t][c]: one warp per row (4 per block), grid.y over tokens.
// Lanes read consecutive elements, so a warp walks each row's bytes front to back.
template <typename T>
__device__ void gemv(const u8* w, int rows, int cols, long long row_bytes, const float* x,
                     float* y) {
    int row = blockIdx.x * 4 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= rows) return;
    const u8* r = w + row * row_bytes;
    const float* xt = x + (long long)blockIdx.y * cols;
    float acc0 = 0.0f, acc1 = 0.0f;
    int c = lane;
    for (; c + 32 < cols; c += 64) {
        acc0 = fmaf(T::at(r, c), xt[c], acc0);
        acc1 = fmaf(T::at(r, c + 32), xt[c + 32], acc1);
    }
    if (c < cols) acc0 = fmaf(T::at(r, c), xt[c], acc0);
    float acc = warp_sum(acc0 + acc1);
    if (lane == 0) y[(long long)blockIdx.y * rows + row] = acc;
}

#define WEIGHT_KERNELS(T, name)                                                                 \
    extern "C" __global__ void dequant_##name(const u8* w, int rows, int cols,                  \
                                              long long row_bytes, const u32* ids, float scale, \
                                              float* out) {                                     \
        dequant<T>(w, rows, cols, row_bytes, ids, scale, out);                                  \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(128) gemv_##name(                              \
        const u8* w, int rows, int cols, long long row_bytes, const float* x, float* y) {       \
        gemv<T>(w, rows, cols, row_bytes, x, y);                                                \
    }

WEIGHT_KERNELS(F32, f32)
WEIGHT_KERNELS(F16, f16)
WEIGHT_KERNELS(BF16, bf16)
WEIGHT_KERNELS(Q4_0, q4_0)
WEIGHT_KERNELS(Q4_1, q4_1)
WEIGHT_KERNELS(Q5_0, q5_0)
WEIGHT_KERNELS(Q5_1, q5_1)
WEIGHT_KERNELS(Q8_0, q8_0)
WEIGHT_KERNELS(Q4_K, q4_k)
WEIGHT_KERNELS(Q5_K, q5_k)
WEIGHT_KERNELS(Q6_K, q6_k)
