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
// Input chunks a warp quantizes at once.
#define QUANT_BATCH 4

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


// Bytes of one quantized input row: the quants, then per chunk d, sum and s; padded to 16.
__device__ __forceinline__ int qinput_bytes(int cols) { return (cols + 12 * (cols >> 5) + 15) & ~15; }

// The quantized row of `cols` inputs laid out at `base`.
__device__ __forceinline__ QInput qinput_at(int cols, const u8* base) {
    int chunks = cols >> 5;
    QInput in;
    in.q = (const int*)base;
    in.d = (const float*)(base + cols);
    in.sum = (const int*)(in.d + chunks);
    in.s = (const float*)(in.sum + chunks);
    return in;
}

// Quantizes chunks first + w, first + w + step, … (w the warp) of `row` (through RMSNorm `norm`
// when given, with rms_norm's arithmetic) into `dst` (shared or global memory). Called by
// every thread of the block (at most QG_WARPS warps).
__device__ QInput quantize_input(const float* row, const float* norm, float eps, int cols, u8* dst,
                                 int first, int step) {
    __shared__ double partial[QG_WARPS];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, chunks = cols >> 5;
    int warps = blockDim.x >> 5;
    signed char* q = (signed char*)dst;
    float* d = (float*)(dst + cols);
    int* sum = (int*)(d + chunks);
    float* s = (float*)(sum + chunks);
    float scale = 1.0f;
    if (norm) {
        double squares = 0.0;
#pragma unroll 4
        for (int i = threadIdx.x; i < cols; i += blockDim.x) {
            float v = row[i];
            squares += (double)(v * v);
        }
        for (int o = 16; o > 0; o >>= 1) squares += __shfl_xor_sync(0xffffffffu, squares, o);
        if (lane == 0) partial[warp] = squares;
        __syncthreads();
        squares = partial[0];
        for (int w = 1; w < warps; ++w) squares += partial[w];
        scale = 1.0f / sqrtf((float)(squares / (double)cols) + eps);
    }
    // QUANT_BATCH chunks per warp at a time, so that their loads are in flight together: one
    // chunk after another, each waiting on its load, made the prologue of a wide input (the FFN
    // down projection's) longer than the products.
    for (int c0 = first + warp; c0 < chunks; c0 += QUANT_BATCH * step) {
        float v[QUANT_BATCH];
#pragma unroll
        for (int b = 0; b < QUANT_BATCH; ++b) {
            int c = c0 + b * step, i = 32 * c + lane;
            v[b] = c < chunks ? (norm ? (row[i] * scale) * norm[i] : row[i]) : 0.0f;
        }
#pragma unroll
        for (int b = 0; b < QUANT_BATCH; ++b) {
            int c = c0 + b * step, i = 32 * c + lane;
            if (c >= chunks) break;  // the same for the whole warp
            float amax = warp_max(fabsf(v[b]));
            float dc = amax / 127.0f, id = dc != 0.0f ? 1.0f / dc : 0.0f;
            int qi = (int)roundf(v[b] * id);
            q[i] = (signed char)qi;
            int total = warp_sum_int(qi);
            if (lane == 0) {
                d[c] = h2f(f2h(dc));
                sum[c] = total;
                s[c] = h2f(f2h((float)total * dc));
            }
        }
    }
    __syncthreads();
    return qinput_at(cols, dst);
}

// Quantizes row blockIdx.y of x (through `norm` when given) to out + blockIdx.y ·
// qinput_bytes(cols), once for every block of the launches that read it: a wide input (the
// FFN down projection's) or one read by thousands of blocks (the output head's) would cost
// more quantized in each block. The row's chunks are spread over grid.x blocks, one per warp.
extern "C" __global__ void __launch_bounds__(QG_WARPS * 32)
quantize_rows(const float* x, const float* norm, float eps, int cols, u8* out) {
    int warps = blockDim.x >> 5;
    quantize_input(x + (long long)blockIdx.y * cols, norm, eps, cols,
                   out + (long long)blockIdx.y * qinput_bytes(cols), blockIdx.x * warps,
                   gridDim.x * warps);
}

// Row blockIdx.y of the input, quantized in shared memory: copied from `pre` (quantize_rows'
// output) when given, else quantized from x here.
__device__ QInput load_input(const float* x, const u8* pre, const float* norm, float eps, int cols,
                             u8* smem) {
    if (!pre)
        return quantize_input(x + (long long)blockIdx.y * cols, norm, eps, cols, smem, 0,
                              blockDim.x >> 5);
    int words = qinput_bytes(cols) / 16;
    const int4* src = (const int4*)pre + (long long)blockIdx.y * words;
    for (int i = threadIdx.x; i < words; i += blockDim.x) ((int4*)smem)[i] = src[i];
    __syncthreads();
    return qinput_at(cols, smem);
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

// Chunk c of a weight row times the input's chunk c, in f32. One struct per format, each with
// ggml's per-block arithmetic for that format's vec_dot.
struct ChunkQ4_0 {
    static const int LANES = 1;
    static __device__ __forceinline__ float dot(const u8* row, int c, int, const QInput& in) {
        const u8* b = row + c * 18;
        Chunk8 x = input_chunk(in, c);
        int sumi = nibble_chunk_sum([&](int k) { return ld_u32_2(b + 2 + 4 * k); }, 0u, x);
        return (ld_f16(b) * in.d[c]) * (float)(sumi - 8 * in.sum[c]);
    }
};

struct ChunkQ4_1 {
    static const int LANES = 1;
    static __device__ __forceinline__ float dot(const u8* row, int c, int, const QInput& in) {
        const u8* b = row + c * 20;
        Chunk8 x = input_chunk(in, c);
        int sumi = nibble_chunk_sum([&](int k) { return ld_u32(b + 4 + 4 * k); }, 0u, x);
        return (ld_f16(b) * in.d[c]) * (float)sumi + ld_f16(b + 2) * in.s[c];
    }
};

struct ChunkQ5_0 {
    static const int LANES = 1;
    static __device__ __forceinline__ float dot(const u8* row, int c, int, const QInput& in) {
        const u8* b = row + c * 22;
        Chunk8 x = input_chunk(in, c);
        int sumi = nibble_chunk_sum([&](int k) { return ld_u32_2(b + 6 + 4 * k); }, ld_u32_2(b + 2), x);
        return (ld_f16(b) * in.d[c]) * (float)(sumi - 16 * in.sum[c]);
    }
};

struct ChunkQ5_1 {
    static const int LANES = 1;
    static __device__ __forceinline__ float dot(const u8* row, int c, int, const QInput& in) {
        const u8* b = row + c * 24;
        Chunk8 x = input_chunk(in, c);
        int sumi = nibble_chunk_sum([&](int k) { return ld_u32(b + 8 + 4 * k); }, ld_u32(b + 4), x);
        return (ld_f16(b) * in.d[c]) * (float)sumi + ld_f16(b + 2) * in.s[c];
    }
};

struct ChunkQ8_0 {
    static const int LANES = 1;
    static __device__ __forceinline__ float dot(const u8* row, int c, int, const QInput& in) {
        const u8* b = row + c * 34;
        Chunk8 x = input_chunk(in, c);
        int sumi = 0;
#pragma unroll
        for (int k = 0; k < 8; ++k) sumi = __dp4a((int)ld_u32_2(b + 2 + 4 * k), x.w[k], sumi);
        return (ld_f16(b) * in.d[c]) * (float)sumi;
    }
};

// Q4_K: chunk c is sub-block j = c mod 8 of super-block c / 8 (32 bytes of nibbles shared by
// sub-blocks 2i and 2i+1; rows are whole 144-byte super-blocks, so 16-byte aligned).
struct ChunkQ4_K {
    static const int LANES = 1;
    static __device__ __forceinline__ float dot(const u8* row, int c, int, const QInput& in) {
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
};

// Q6_K: chunk c is group g of half n of super-block c / 8 (j = c mod 8 = 4n + g), split over
// eight lanes, lane `sub` on elements 4·sub.. (half of them under each of the chunk's two
// 16-element scales): one 4-byte word of low and of high bits each, so that a warp's loads
// cover four chunks' contiguous bytes instead of 32 chunks' scattered ones.
struct ChunkQ6_K {
    static const int LANES = 8;
    static __device__ __forceinline__ float dot(const u8* row, int c, int sub, const QInput& in) {
        const u8* b = row + (c >> 3) * 210;
        int j = c & 7, n = j >> 2, g = j & 3;
        u32 ql = ld_u32_2(b + 64 * n + 32 * (g & 1) + 4 * sub);
        u32 qh = ld_u32_2(b + 128 + 32 * n + 4 * sub);
        u32 q = ((ql >> (g >= 2 ? 4 : 0)) & 0x0F0F0F0Fu) | (((qh >> (2 * g)) & 0x03030303u) << 4);
        int x = in.q[8 * c + sub];
        int sumi = __dp4a((int)q, x, 0) - 32 * __dp4a(0x01010101, x, 0);
        int sc = (int)(signed char)b[192 + 8 * n + 2 * g + (sub >> 2)];
        return (ld_f16(b + 208) * in.d[c]) * (float)(sc * sumi);
    }
};

// The R rows of a warp, and their sums (passed by value, indexed by unrolled constants, so
// they stay in registers).
template <int R>
struct Rows {
    const u8* p[R];
};
template <int R>
struct Sums {
    float v[R];
};

// Σ over the chunks first.. < last of each row times the input, in format C: C::LANES lanes on
// each chunk, the warp on 32 / C::LANES chunks at a time. Returns this lane's share.
template <typename C, int R>
__device__ __forceinline__ Sums<R> dot_rows(Rows<R> w, int first, int last, int lane,
                                            const QInput& in) {
    Sums<R> acc;
#pragma unroll
    for (int k = 0; k < R; ++k) acc.v[k] = 0.0f;
    int sub = lane % C::LANES;
    for (int c = first + lane / C::LANES; c < last; c += 32 / C::LANES) {
#pragma unroll
        for (int k = 0; k < R; ++k) acc.v[k] += C::dot(w.p[k], c, sub, in);
    }
    return acc;
}

// dot_rows for the warp's format (the same for its R rows), chosen once per warp.
template <int R>
__device__ __forceinline__ Sums<R> dot_rows_of(int format, Rows<R> w, int first, int last,
                                               int lane, const QInput& in) {
    switch (format) {
        case 2: return dot_rows<ChunkQ4_0, R>(w, first, last, lane, in);
        case 3: return dot_rows<ChunkQ4_1, R>(w, first, last, lane, in);
        case 6: return dot_rows<ChunkQ5_0, R>(w, first, last, lane, in);
        case 7: return dot_rows<ChunkQ5_1, R>(w, first, last, lane, in);
        case 8: return dot_rows<ChunkQ8_0, R>(w, first, last, lane, in);
        case 12: return dot_rows<ChunkQ4_K, R>(w, first, last, lane, in);
        default: return dot_rows<ChunkQ6_K, R>(w, first, last, lane, in);
    }
}

// What a launch does with its dot products.
#define QG_STORE 0       // y = W·x + bias
#define QG_ACCUMULATE 1  // y += W·x (the residual stream)
#define QG_SILU 2        // y0 = silu(gate·x) · (up·x): matrix 0 the gate, matrix 1 the up
#define QG_GELU 3        // the same with GELU
#define QG_ROPE 4        // Q, K, V rows in RoPE pairs: Q rotated, K rotated and V into the cache

// One matrix of a launch.
struct QMatrix {
    const u8* w;
    long long row_bytes;
    const float* bias;
    float* y;
    int rows, format;
};

// Where a RoPE launch puts its results, and how it rotates (rope_store's parameters).
struct QRope {
    const int* pos;
    const int* pages;
    u16* k_cache;
    u16* v_cache;
    int head_dim, dims, neox;
    float theta_scale, freq_scale;
};

// Pair `pair` of a RoPE launch: its matrix (0 Q, 1 K, 2 V), its two rows and the rotation
// index (-1: not rotated). Q and K heads pair as rope_store rotates them (NEOX: i and
// i + dims/2; otherwise 2i and 2i + 1; the unrotated tail in consecutive pairs), V rows in
// consecutive pairs.
__device__ __forceinline__ int rope_pair(const QMatrix& m0, const QMatrix& m1, const QRope& rope,
                                         int pair, int* a, int* b, int* rotation) {
    int which = 0;
    if (pair >= m0.rows / 2) {
        pair -= m0.rows / 2;
        which = pair >= m1.rows / 2 ? 2 : 1;
        if (which == 2) pair -= m1.rows / 2;
    }
    int half = rope.head_dim / 2, head = pair / half, j = pair - head * half;
    int base = which == 2 ? 0 : head * rope.head_dim;
    *rotation = which != 2 && j < rope.dims / 2 ? j : -1;
    if (which == 2) {
        *a = 2 * pair;
    } else if (rope.neox && j < rope.dims / 2) {
        *a = base + j;
    } else if (rope.neox) {
        *a = base + rope.dims + 2 * (j - rope.dims / 2);
    } else {
        *a = base + 2 * j;
    }
    *b = rope.neox && *rotation >= 0 ? *a + rope.dims / 2 : *a + 1;
    return which;
}

// Rotates (x0, x1) by pair i's angle at position p, as rope_store.
__device__ __forceinline__ void rotate(float* x0, float* x1, int p, int i, const QRope& rope) {
    float theta = (float)p;
    for (int j = 0; j < i; ++j) theta *= rope.theta_scale;
    float angle = rope.freq_scale * theta;
    float s = sinf(angle), c = cosf(angle), v0 = *x0, v1 = *x1;
    *x0 = v0 * c - v1 * s;
    *x1 = v0 * s + v1 * c;
}

// The epilogue of a RoPE launch for the pair in rows a, b of matrix `which`, token t.
__device__ __forceinline__ void rope_epilogue(const QMatrix& mq, const QMatrix& mk,
                                              const QMatrix& mv, const QRope& rope, int which,
                                              int a, int b, int rotation, float va, float vb,
                                              long long t) {
    int p = *rope.pos + (int)t;
    if (rotation >= 0) rotate(&va, &vb, p, rotation, rope);
    if (which == 0) {
        mq.y[t * mq.rows + a] = va;
        mq.y[t * mq.rows + b] = vb;
    } else {
        const QMatrix& m = which == 1 ? mk : mv;
        u16* cache = (which == 1 ? rope.k_cache : rope.v_cache) + kv_row(rope.pages, p) * m.rows;
        cache[a] = f2h(va);
        cache[b] = f2h(vb);
    }
}

// Matrix i of a launch (a selection, not an array index: the three stay in registers).
__device__ __forceinline__ QMatrix pick(const QMatrix& a, const QMatrix& b, const QMatrix& c, int i) {
    return i == 0 ? a : (i == 1 ? b : c);
}

// R rows per warp-slot (R = 2: two consecutive rows of the concatenated matrices, which must
// then share one format, or with a gated mode a gate row and its up row), `parts` warps per
// slot (each on a contiguous run of the chunks, summed through shared memory), blockDim.x / 32
// warps per block (at most QG_WARPS), grid.x over slots, grid.y over tokens.
template <int R>
__device__ void qgemv(const QMatrix& m0, const QMatrix& m1, const QMatrix& m2, const QRope& rope,
                      int cols, int parts, const float* x, const u8* pre, const float* norm,
                      float eps, int mode) {
    extern __shared__ int4 qgemv_shared[];
    __shared__ float s_part[QG_WARPS][R];
    QInput in = load_input(x, pre, norm, eps, cols, (u8*)qgemv_shared);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, part = warp % parts;
    int slot = blockIdx.x * ((blockDim.x >> 5) / parts) + warp / parts;
    bool gated = mode == QG_SILU || mode == QG_GELU, roped = mode == QG_ROPE;
    int total = gated ? m0.rows : m0.rows + m1.rows + m2.rows;
    int which[R], row[R], format = 0, rotation = -1;
    bool valid[R];
    Rows<R> w;
    if (roped) {
        // R is 2: the slot is a pair.
        valid[0] = valid[R - 1] = 2 * slot < total;
        which[0] = which[R - 1] =
            rope_pair(m0, m1, rope, valid[0] ? slot : 0, &row[0], &row[R - 1], &rotation);
    }
#pragma unroll
    for (int k = 0; k < R; ++k) {
        int r = gated ? slot : R * slot + k;
        if (!roped) valid[k] = r < total;
        r = valid[k] ? r : 0;
        if (roped) {
            r = row[k];
        } else if (gated) {
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
        w.p[k] = mk.w + (long long)r * mk.row_bytes;
        format = mk.format;
    }
    int chunks = cols >> 5, first = chunks * part / parts, last = chunks * (part + 1) / parts;
    Sums<R> share = dot_rows_of<R>(format, w, first, last, lane, in);
    float acc[R];
#pragma unroll
    for (int k = 0; k < R; ++k) acc[k] = warp_sum(share.v[k]);
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
    if (roped) {
        if (!valid[0]) return;
        QMatrix mb = pick(m0, m1, m2, which[0]);
        float va = acc[0], vb = acc[R - 1];
        if (mb.bias) {
            va = va + mb.bias[row[0]];
            vb = vb + mb.bias[row[R - 1]];
        }
        rope_epilogue(m0, m1, m2, rope, which[0], row[0], row[R - 1], rotation, va, vb, t);
        return;
    }
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

#define QGEMV_KERNEL(R)                                                                            \
    extern "C" __global__ void __launch_bounds__(QG_WARPS * 32) qgemv_r##R(                        \
        const u8* w0, const u8* w1, const u8* w2, long long rb0, long long rb1, long long rb2,     \
        const float* b0, const float* b1, const float* b2, float* y0, float* y1, float* y2,        \
        int rows0, int rows1, int rows2, int f0, int f1, int f2, int cols, int parts,              \
        const float* x, const u8* pre, const float* norm, float eps, int mode, const int* pos,     \
        const int* pages, u16* k_cache, u16* v_cache, int head_dim, int rope_dims,                 \
        float theta_scale, float freq_scale, int neox) {                                           \
        QMatrix m0 = {w0, rb0, b0, y0, rows0, f0}, m1 = {w1, rb1, b1, y1, rows1, f1},              \
                m2 = {w2, rb2, b2, y2, rows2, f2};                                                 \
        QRope rope = {pos, pages, k_cache, v_cache, head_dim, rope_dims, neox, theta_scale,        \
                      freq_scale};                                                                 \
        qgemv<R>(m0, m1, m2, rope, cols, parts, x, pre, norm, eps, mode);                          \
    }

QGEMV_KERNEL(1)
QGEMV_KERNEL(2)
