// Decode GEMV on int8 activations, as the CPU backend multiplies (ggml's vec_dot with Q8
// activation blocks): each block quantizes its input row (RMS-normalized first when asked) into
// shared memory as 32-element chunks of int8 with a scale, then every weight chunk is one
// integer dot product (dp4a) scaled once. Far fewer instructions per weight than dequantizing
// to f32, which is what bounded the f32 GEMVs (quant.cu) at decode.
//
// Activation chunks are quantized as the CPU's quantize_row_q8_0/q8_1 (d = amax / 127, quants
// roundf(x / d) with the unrounded d, d stored rounded to f16, s = f16(sum · d)), so for the
// 32-element formats each chunk's integer sum and scale are the CPU's; K-quants use the same
// 32-element activation chunks where the CPU uses 256-element Q8_K blocks.
//
// Formats (ggml type ids): Q4_0 2, Q4_1 3, Q5_0 6, Q5_1 7, Q8_0 8, Q4_K 12, Q6_K 14 (QGEMV_TYPES
// in ops.rs). One launch may mix them: the format is an argument per matrix.

#define QG_WARPS 8

// The block's quantized input row, in shared memory.
struct QInput {
    const int* q;       // cols int8 quants, 4 per word
    const float* d;     // per chunk: the scale, f16-rounded
    const int* sum;     // per chunk: the sum of its quants
    const float* s;     // per chunk: f16(sum · unrounded d), for the formats with a min
};

__device__ __forceinline__ int warp_sum_int(int v) {
#if __CUDA_ARCH__ >= 800
    return __reduce_add_sync(0xffffffffu, v);
#else
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
#endif
}


// Quantizes row blockIdx.y of x (through RMSNorm `norm` when given, with rms_norm's arithmetic)
// into `smem`. Called by every thread of the block.
__device__ QInput quantize_input(const float* x, const float* norm, float eps, int cols, u8* smem) {
    __shared__ double partial[QG_WARPS];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, chunks = cols >> 5;
    const float* row = x + (long long)blockIdx.y * cols;
    QInput in;
    signed char* q = (signed char*)smem;
    float* d = (float*)(smem + cols);
    int* sum = (int*)(d + chunks);
    float* s = (float*)(sum + chunks);
    float scale = 1.0f;
    if (norm) {
        double squares = 0.0;
        for (int i = threadIdx.x; i < cols; i += blockDim.x) {
            float v = row[i];
            squares += (double)(v * v);
        }
        for (int o = 16; o > 0; o >>= 1) squares += __shfl_xor_sync(0xffffffffu, squares, o);
        if (lane == 0) partial[warp] = squares;
        __syncthreads();
        squares = partial[0];
        for (int w = 1; w < QG_WARPS; ++w) squares += partial[w];
        scale = 1.0f / sqrtf((float)(squares / (double)cols) + eps);
    }
    for (int c = warp; c < chunks; c += QG_WARPS) {
        int i = 32 * c + lane;
        float v = norm ? (row[i] * scale) * norm[i] : row[i];
        float amax = warp_max(fabsf(v));
        float dc = amax / 127.0f, id = dc != 0.0f ? 1.0f / dc : 0.0f;
        int qi = (int)roundf(v * id);
        q[i] = (signed char)qi;
        int total = warp_sum_int(qi);
        if (lane == 0) {
            d[c] = h2f(f2h(dc));
            sum[c] = total;
            s[c] = h2f(f2h((float)total * dc));
        }
    }
    __syncthreads();
    in.q = (const int*)q;
    in.d = d;
    in.sum = sum;
    in.s = s;
    return in;
}

// The eight words of chunk c's quants.
struct Chunk8 {
    int w[8];
};

__device__ __forceinline__ Chunk8 input_chunk(const QInput& in, int c) {
    const int4* p = (const int4*)(in.q + 8 * c);
    int4 a = p[0], b = p[1];
    return Chunk8{{a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w}};
}

// Nibbles and fifth bits of a 32-element chunk as 4-byte words: 4 bits of `h` (one per byte) go
// to bit 4 of bytes 0..3 by one multiplication (no two products overlap).
__device__ __forceinline__ u32 fifth_bits(u32 h) { return ((h & 15) * 0x02040810u) & 0x10101010u; }

// Σ q · x over a chunk whose 16 quant bytes hold elements 0..15 in the low nibbles and 16..31
// in the high ones (Q4_0, Q4_1, Q5_0, Q5_1); `qh` the fifth bits, or 0.
template <typename Load>
__device__ __forceinline__ int nibble_chunk_sum(Load load, u32 qh, const Chunk8& x) {
    int sumi = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        u32 q = load(k);
        u32 lo = (q & 0x0F0F0F0Fu) | fifth_bits(qh >> (4 * k));
        u32 hi = ((q >> 4) & 0x0F0F0F0Fu) | fifth_bits(qh >> (16 + 4 * k));
        sumi = __dp4a((int)lo, x.w[k], sumi);
        sumi = __dp4a((int)hi, x.w[4 + k], sumi);
    }
    return sumi;
}

// Chunk c of a weight row times the input's chunk c, in f32. One function per format, each with
// ggml's per-block arithmetic for that format's vec_dot.
__device__ __forceinline__ float chunk_q4_0(const u8* row, int c, const QInput& in) {
    const u8* b = row + c * 18;
    Chunk8 x = input_chunk(in, c);
    int sumi = nibble_chunk_sum([&](int k) { return ld_u32_2(b + 2 + 4 * k); }, 0u, x);
    return (ld_f16(b) * in.d[c]) * (float)(sumi - 8 * in.sum[c]);
}

__device__ __forceinline__ float chunk_q4_1(const u8* row, int c, const QInput& in) {
    const u8* b = row + c * 20;
    Chunk8 x = input_chunk(in, c);
    int sumi = nibble_chunk_sum([&](int k) { return ld_u32(b + 4 + 4 * k); }, 0u, x);
    return (ld_f16(b) * in.d[c]) * (float)sumi + ld_f16(b + 2) * in.s[c];
}

__device__ __forceinline__ float chunk_q5_0(const u8* row, int c, const QInput& in) {
    const u8* b = row + c * 22;
    Chunk8 x = input_chunk(in, c);
    int sumi = nibble_chunk_sum([&](int k) { return ld_u32_2(b + 6 + 4 * k); }, ld_u32_2(b + 2), x);
    return (ld_f16(b) * in.d[c]) * (float)(sumi - 16 * in.sum[c]);
}

__device__ __forceinline__ float chunk_q5_1(const u8* row, int c, const QInput& in) {
    const u8* b = row + c * 24;
    Chunk8 x = input_chunk(in, c);
    int sumi = nibble_chunk_sum([&](int k) { return ld_u32(b + 8 + 4 * k); }, ld_u32(b + 4), x);
    return (ld_f16(b) * in.d[c]) * (float)sumi + ld_f16(b + 2) * in.s[c];
}

__device__ __forceinline__ float chunk_q8_0(const u8* row, int c, const QInput& in) {
    const u8* b = row + c * 34;
    Chunk8 x = input_chunk(in, c);
    int sumi = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) sumi = __dp4a((int)ld_u32_2(b + 2 + 4 * k), x.w[k], sumi);
    return (ld_f16(b) * in.d[c]) * (float)sumi;
}

// Q4_K: chunk c is sub-block j = c mod 8 of super-block c / 8 (32 bytes of nibbles shared by
// sub-blocks 2i and 2i+1; rows are whole 144-byte super-blocks, so 16-byte aligned).
__device__ __forceinline__ float chunk_q4_k(const u8* row, int c, const QInput& in) {
    const u8* b = row + (c >> 3) * 144;
    int j = c & 7, shift = 4 * (j & 1);
    int sc, m;
    scale_min_k4(j, b + 4, &sc, &m);
    const U4* qs = (const U4*)(b + 16 + 32 * (j >> 1));
    U4 q0 = qs[0], q1 = qs[1];
    u32 words[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
    Chunk8 x = input_chunk(in, c);
    int sumi = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) sumi = __dp4a((int)((words[k] >> shift) & 0x0F0F0F0Fu), x.w[k], sumi);
    float dx = in.d[c];
    return (ld_f16(b) * dx) * (float)(sc * sumi) - (ld_f16(b + 2) * dx) * (float)(m * in.sum[c]);
}

// Q6_K: chunk c is group g of half n of super-block c / 8 (j = c mod 8 = 4n + g); its two
// 16-element halves have scales of their own.
__device__ __forceinline__ float chunk_q6_k(const u8* row, int c, const QInput& in) {
    const u8* b = row + (c >> 3) * 210;
    int j = c & 7, n = j >> 2, g = j & 3;
    const u8* ql = b + 64 * n + 32 * (g & 1);
    const u8* qh = b + 128 + 32 * n;
    int nib_shift = g >= 2 ? 4 : 0, hi_shift = 2 * g;
    Chunk8 x = input_chunk(in, c);
    int sumi[2] = {0, 0}, xsum[2] = {0, 0};
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        u32 q = ((ld_u32_2(ql + 4 * k) >> nib_shift) & 0x0F0F0F0Fu) |
                (((ld_u32_2(qh + 4 * k) >> hi_shift) & 0x03030303u) << 4);
        sumi[k >> 2] = __dp4a((int)q, x.w[k], sumi[k >> 2]);
        xsum[k >> 2] = __dp4a(0x01010101, x.w[k], xsum[k >> 2]);
    }
    u32 scales = ld_u16(b + 192 + 8 * n + 2 * g);
    int sc0 = (int)(signed char)(scales & 255), sc1 = (int)(signed char)(scales >> 8);
    int total = sc0 * (sumi[0] - 32 * xsum[0]) + sc1 * (sumi[1] - 32 * xsum[1]);
    return (ld_f16(b + 208) * in.d[c]) * (float)total;
}

__device__ __forceinline__ float chunk_dot(int format, const u8* row, int c, const QInput& in) {
    switch (format) {
        case 2: return chunk_q4_0(row, c, in);
        case 3: return chunk_q4_1(row, c, in);
        case 6: return chunk_q5_0(row, c, in);
        case 7: return chunk_q5_1(row, c, in);
        case 8: return chunk_q8_0(row, c, in);
        case 12: return chunk_q4_k(row, c, in);
        default: return chunk_q6_k(row, c, in);
    }
}

// What a launch does with its dot products.
#define QG_STORE 0       // y = W·x + bias
#define QG_ACCUMULATE 1  // y += W·x (the residual stream)
#define QG_SILU 2        // y0 = silu(gate·x) · (up·x): matrix 0 the gate, matrix 1 the up
#define QG_GELU 3        // the same with GELU

// One matrix of a launch.
struct QMatrix {
    const u8* w;
    long long row_bytes;
    const float* bias;
    float* y;
    int rows, format;
};

// Matrix i of a launch (a selection, not an array index: the three stay in registers).
__device__ __forceinline__ QMatrix pick(const QMatrix& a, const QMatrix& b, const QMatrix& c, int i) {
    return i == 0 ? a : (i == 1 ? b : c);
}

// R rows per warp-slot (R = 2: two consecutive rows of the concatenated matrices, or with a
// gated mode a gate row and its up row), `parts` warps per slot (each on a contiguous run of
// the chunks, summed through shared memory), grid.x over slots, grid.y over tokens.
template <int R>
__device__ void qgemv(const QMatrix& m0, const QMatrix& m1, const QMatrix& m2, int cols,
                      int parts, const float* x, const float* norm, float eps, int mode) {
    extern __shared__ int4 qgemv_shared[];
    __shared__ float s_part[QG_WARPS][R];
    QInput in = quantize_input(x, norm, eps, cols, (u8*)qgemv_shared);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, part = warp % parts;
    int slot = blockIdx.x * (QG_WARPS / parts) + warp / parts;
    bool gated = mode >= QG_SILU;
    int total = gated ? m0.rows : m0.rows + m1.rows + m2.rows;
    int which[R], row[R], format[R];
    bool valid[R];
    const u8* w[R];
#pragma unroll
    for (int k = 0; k < R; ++k) {
        int r = gated ? slot : R * slot + k;
        valid[k] = r < total;
        r = valid[k] ? r : 0;
        if (gated) {
            which[k] = k;
        } else if (r < m0.rows) {
            which[k] = 0;
        } else if (r < m0.rows + m1.rows) {
            which[k] = 1;
            r -= m0.rows;
        } else {
            which[k] = 2;
            r -= m0.rows + m1.rows;
        }
        row[k] = r;
        QMatrix mk = pick(m0, m1, m2, which[k]);
        w[k] = mk.w + (long long)r * mk.row_bytes;
        format[k] = mk.format;
    }
    int chunks = cols >> 5, first = chunks * part / parts, last = chunks * (part + 1) / parts;
    float acc[R];
#pragma unroll
    for (int k = 0; k < R; ++k) acc[k] = 0.0f;
    for (int c = first + lane; c < last; c += 32) {
#pragma unroll
        for (int k = 0; k < R; ++k) acc[k] += chunk_dot(format[k], w[k], c, in);
    }
#pragma unroll
    for (int k = 0; k < R; ++k) acc[k] = warp_sum(acc[k]);
    if (parts > 1) {
        if (lane == 0) {
#pragma unroll
            for (int k = 0; k < R; ++k) s_part[warp][k] = acc[k];
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < R; ++k) {
            acc[k] = s_part[warp][k];
            for (int i = 1; i < parts; ++i) acc[k] += s_part[warp + i][k];
        }
    }
    if (part != 0 || lane != 0) return;
    long long t = blockIdx.y;
    if (gated) {
        if (valid[0]) {
            float g = acc[0];
            m0.y[t * m0.rows + row[0]] = (mode == QG_GELU ? gelu_tanh(g) : silu(g)) * acc[R - 1];
        }
        return;
    }
#pragma unroll
    for (int k = 0; k < R; ++k) {
        if (!valid[k]) continue;
        QMatrix mk = pick(m0, m1, m2, which[k]);
        float v = acc[k];
        if (mk.bias) v = v + mk.bias[row[k]];
        float* dst = mk.y + t * mk.rows + row[k];
        *dst = mode == QG_ACCUMULATE ? *dst + v : v;
    }
}

#define QGEMV_KERNEL(R)                                                                          \
    extern "C" __global__ void __launch_bounds__(QG_WARPS * 32) qgemv_r##R(                      \
        const u8* w0, const u8* w1, const u8* w2, long long rb0, long long rb1, long long rb2,   \
        const float* b0, const float* b1, const float* b2, float* y0, float* y1, float* y2,      \
        int rows0, int rows1, int rows2, int f0, int f1, int f2, int cols, int parts,            \
        const float* x, const float* norm, float eps, int mode) {                                \
        QMatrix m0 = {w0, rb0, b0, y0, rows0, f0}, m1 = {w1, rb1, b1, y1, rows1, f1},            \
                m2 = {w2, rb2, b2, y2, rows2, f2};                                               \
        qgemv<R>(m0, m1, m2, cols, parts, x, norm, eps, mode);                                   \
    }

QGEMV_KERNEL(1)
QGEMV_KERNEL(2)
