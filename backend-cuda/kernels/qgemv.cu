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
// Formats: those with a chunk decoder below (Chunk*), listed with their ggml type ids in
// src/formats.rs, which the dispatch (LLORCH_CHUNK_SWITCH) is generated from; MXFP4 only for the
// routed experts (moe.cu). One launch may mix them: the format is a parameter per matrix.

// QG_WARPS (warps a block) comes from src/program.rs.
// Input chunks a warp quantizes at once.
#define QUANT_BATCH 4

// One quantized input row (in shared or global memory): `cols` int8 quants, 4 per word, then
// per 32-element chunk its scale d (f16-rounded), the sum of its quants and s = f16(sum ·
// unrounded d) for the formats with a min. Rows of a batch lie qinput_bytes(cols) apart.
struct QInput {
    const int* q;
    const float* d;
    const int* sum;
    const float* s;
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
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, chunks = cols >> 5;
    int warps = blockDim.x >> 5;
    signed char* q = (signed char*)dst;
    float* d = (float*)(dst + cols);
    int* sum = (int*)(d + chunks);
    float* s = (float*)(sum + chunks);
    float scale = 1.0f;
    if (norm) scale = rms_scale(row, cols, eps);
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
extern "C" __global__ void __launch_bounds__(QG_WARPS * 32) quantize_rows(const __grid_constant__ QuantizeParams p) {
    int warps = blockDim.x >> 5;
    quantize_input(p.x + (long long)blockIdx.y * p.cols, p.norm, p.eps, p.cols,
                   p.out + (long long)blockIdx.y * qinput_bytes(p.cols), blockIdx.x * warps,
                   gridDim.x * warps);
}

// The T input rows of this block's token group (tokens t0.. < n), quantized: read in place from
// `pre` (quantize_rows' output) when given, which every batched launch takes (quantizing T rows
// one after the other in each block made the launch wait on that chain). A one-row launch
// without it quantizes x (through `norm`) into shared memory here. Returns the first row; the
// others follow qinput_bytes(cols) apart. (A one-row launch once copied `pre` into shared
// memory first: on an 8B model's FFN down projection that copy, 19.7 KB in each of 4,096
// blocks, moved more bytes than the weights and held every block's loads behind a barrier;
// read in place, the row stays in L1 for the warps of an SM: a one-row step 4.90 → 4.59 ms on
// an H200.)
template <int T>
__device__ const u8* load_inputs(const float* x, const u8* pre, const float* norm, float eps,
                                 int cols, int t0, u8* smem) {
    if (T > 1 || pre) return pre + t0 * (long long)qinput_bytes(cols);
    return (const u8*)quantize_input(x + (long long)t0 * cols, norm, eps, cols, smem, 0,
                                     blockDim.x >> 5).q;
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

// One weight chunk in registers, as a format's `load` leaves it for its `dot` with each token
// of the block: the quants as bytes ready for dp4a (element i of the chunk in byte i), and the
// scales. Loaded once, multiplied by up to QG_MAX_TOKENS input rows.
struct WChunk {
    u32 q[8];
    float d, m;
    int sc, mn;
};

// A token chunk's scales as the formulas take them: d, s (ggml's q8_1 s: d · Σ q rounded to
// f16), the sum of its quants and d · sum in f32 (the minimum's factor of Q4_K and Q5_K).
// Built once per token chunk by x_scale, so the GEMM computes d · sum once for all its rows.
struct __align__(16) XScale {
    float d, s, ds;
    int sum;
};
__device__ __forceinline__ XScale x_scale(float d, int sum, float s) {
    return XScale{d, s, d * (float)sum, sum};
}

// Σ q · x over the chunk's eight words of quants.
__device__ __forceinline__ int chunk_sum(const WChunk& w, const Chunk8& x) {
    int sumi = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) sumi = __dp4a((int)w.q[k], x.w[k], sumi);
    return sumi;
}

// The 16 quant bytes of a 32-element chunk holding elements 0..15 in the low nibbles and 16..31
// in the high ones (Q4_0, Q4_1, Q5_0, Q5_1), with the fifth bits `qh` (or 0), as 8 words.
template <typename Load>
__device__ __forceinline__ void nibble_chunk(Load load, u32 qh, WChunk* w) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        u32 q = load(k);
        w->q[k] = (q & 0x0F0F0F0Fu) | fifth_bits(qh >> (4 * k));
        w->q[4 + k] = ((q >> 4) & 0x0F0F0F0Fu) | fifth_bits(qh >> (16 + 4 * k));
    }
}

// Chunk c of a weight row: `load` reads it, `dot` multiplies it by the input's chunk c in f32.
// One struct per format, each with ggml's per-block arithmetic for that format's vec_dot (the
// integer sum is exact, so only the float expressions fix the result; Q4_K and Q5_K fold their
// sub-block scales into d and m, exactly).
struct ChunkQ4_0 {
    static __device__ __forceinline__ WChunk load(const u8* row, int c) {
        const u8* b = row + c * 18;
        WChunk w;
        w.d = ld_f16(b);
        u32 q[4];
        ld_words_2<4>(b + 2, q);
        nibble_chunk([&](int k) { return q[k]; }, 0u, &w);
        return w;
    }
    static __device__ __forceinline__ float partial(const WChunk& w, const XScale& x, int low,
                                                    int) {
        return (w.d * x.d) * (float)(low - 8 * x.sum);
    }
};

struct ChunkQ4_1 {
    static __device__ __forceinline__ WChunk load(const u8* row, int c) {
        const u8* b = row + c * 20;
        WChunk w;
        w.d = ld_f16(b);
        w.m = ld_f16(b + 2);
        nibble_chunk([&](int k) { return ld_u32(b + 4 + 4 * k); }, 0u, &w);
        return w;
    }
    static __device__ __forceinline__ float partial(const WChunk& w, const XScale& x, int low,
                                                    int) {
        return (w.d * x.d) * (float)low + w.m * x.s;
    }
};

struct ChunkQ5_0 {
    static __device__ __forceinline__ WChunk load(const u8* row, int c) {
        const u8* b = row + c * 22;
        WChunk w;
        w.d = ld_f16(b);
        u32 q[4];
        ld_words_2<4>(b + 6, q);
        nibble_chunk([&](int k) { return q[k]; }, ld_u32_2(b + 2), &w);
        return w;
    }
    static __device__ __forceinline__ float partial(const WChunk& w, const XScale& x, int low,
                                                    int) {
        return (w.d * x.d) * (float)(low - 16 * x.sum);
    }
};

struct ChunkQ5_1 {
    static __device__ __forceinline__ WChunk load(const u8* row, int c) {
        const u8* b = row + c * 24;
        WChunk w;
        w.d = ld_f16(b);
        w.m = ld_f16(b + 2);
        nibble_chunk([&](int k) { return ld_u32(b + 8 + 4 * k); }, ld_u32(b + 4), &w);
        return w;
    }
    static __device__ __forceinline__ float partial(const WChunk& w, const XScale& x, int low,
                                                    int high) {
        return ChunkQ4_1::partial(w, x, low, high);
    }
};

struct ChunkQ8_0 {
    static __device__ __forceinline__ WChunk load(const u8* row, int c) {
        const u8* b = row + c * 34;
        WChunk w;
        w.d = ld_f16(b);
        ld_words_2<8>(b + 2, w.q);
        return w;
    }
    static __device__ __forceinline__ float partial(const WChunk& w, const XScale& x, int low,
                                                    int) {
        return (w.d * x.d) * (float)low;
    }
};

// MXFP4 (gpt-oss's experts): 17-byte blocks, an E8M0 exponent e then 16 bytes of 4-bit codes
// (elements 0..15 in the low nibbles, 16..31 in the high ones) standing for the int8 values
// 0 1 2 3 4 6 8 12 and their negatives, scaled by 2^(e - 128) (ggml's e8m0 "half", whose
// e = 0 and 1 are the subnormals 2^-128 and 2^-127). Blocks sit at any byte offset: a block is
// read as the five aligned words that hold it (never past the word of its last byte), so that a
// warp's loads are few wide transactions rather than seventeen of single bytes. Decoding is
// byte permutes only: the decode, not memory, bounds the experts' GEMVs, so each word of codes
// costs a dozen integer instructions.

// PTX's byte permute as is: byte i of the result is byte `select` nibble i of the pair (b, a),
// the nibbles' fourth bits clear (set, it would copy the byte's sign instead). __byte_perm masks
// its selector first, an instruction more for each half of a word of codes.
__device__ __forceinline__ u32 permute(u32 a, u32 b, u32 select) {
    u32 r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(select));
    return r;
}

// The int8 values of the eight codes of one word of an MXFP4 block (byte i: code 2i in its low
// nibble, element 4k + i, and code 2i + 1 in its high nibble, element 16 + 4k + i): the low
// nibbles' values in .x, the high nibbles' in .y, element order in each. Each 16-bit half's four
// codes look their value up in the table's positive and negative halves by their low three
// bits, the fourth bit picks between the two, and two last permutes split the interleaved low
// and high elements.
__device__ __forceinline__ uint2 mxfp4_word_values(u32 q) {
    const u32 pos_lo = 0x03020100u, pos_hi = 0x0c080604u;  // 0 1 2 3 | 4 6 8 12
    const u32 neg_lo = 0xfdfeff00u, neg_hi = 0xf4f8fafcu;  // 0 -1 -2 -3 | -4 -6 -8 -12
    u32 index = q & 0x77777777u, sign = 0x32103210u + ((q & 0x88888888u) >> 1);
    u32 half[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        u32 codes = index >> (16 * h);
        u32 pos = permute(pos_lo, pos_hi, codes), neg = permute(neg_lo, neg_hi, codes);
        half[h] = permute(pos, neg, sign >> (16 * h));
    }
    return make_uint2(permute(half[0], half[1], 0x6420u), permute(half[0], half[1], 0x7531u));
}

struct ChunkMXFP4 {
    static __device__ __forceinline__ WChunk load(const u8* row, int c) {
        const u8* block = row + c * 17;
        u32 lead = (u32)(unsigned long long)block & 3u, v[5];
        const u32* words = (const u32*)(block - lead);
#pragma unroll
        for (int i = 0; i < 5; ++i) v[i] = __ldg(words + i);
        u32 e = (v[0] >> (8 * lead)) & 0xFFu;
        // Code word k is bytes lead + 1 + 4k.. of the block's words: bytes lead + 1.. of the
        // pair v[k], v[k + 1] (at most byte 7 of the pair, as lead ≤ 3).
        u32 select = 0x3210u + (lead + 1) * 0x1111u;
        WChunk w;
        w.d = e < 2 ? __uint_as_float(0x00200000u << e) : __uint_as_float((e - 1) << 23);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            uint2 values = mxfp4_word_values(permute(v[k], v[k + 1], select));
            w.q[k] = values.x;
            w.q[4 + k] = values.y;
        }
        return w;
    }
    static __device__ __forceinline__ float partial(const WChunk& w, const XScale& x, int low,
                                                    int high) {
        return ChunkQ8_0::partial(w, x, low, high);
    }
};

// Q4_K: chunk c is sub-block j = c mod 8 of super-block c / 8 (32 bytes of nibbles shared by
// sub-blocks 2i and 2i+1; rows are whole 144-byte super-blocks, so 16-byte aligned). For the
// GEMM, `fetch` only loads (the header: d, dmin and the 12 bytes of scales, and the chunk's 32
// bytes of nibbles, three 16-byte words) and `decode` unpacks, so that its next tile step's
// loads stay in flight while it multiplies the current one (ChunkFetch; a 16-row decode step of
// an 8B Q4_K_M model 9.47 → 9.00 ms). `load` gives the same chunk (kernel tests: the GEMV's and
// the GEMM's bits are equal).
struct ChunkQ4_K {
    struct Raw {
        U4 head, q0, q1;
    };
    static __device__ __forceinline__ Raw fetch(const u8* row, int c) {
        const U4* b = (const U4*)(row + (c >> 3) * 144);
        const U4* qs = b + 1 + 2 * ((c & 7) >> 1);
        return Raw{b[0], qs[0], qs[1]};
    }
    // Byte k (0..15) of the header.
    static __device__ __forceinline__ u32 head_byte(const U4& h, int k) {
        u32 w = k < 4 ? h.x : k < 8 ? h.y : k < 12 ? h.z : h.w;
        return (w >> (8 * (k & 3))) & 0xFFu;
    }
    static __device__ __forceinline__ WChunk decode(const Raw& r, int c) {
        int j = c & 7, shift = 4 * (j & 1);
        WChunk w;
        // scale_min_k4 on the scales at header bytes 4..15.
        if (j < 4) {
            w.sc = head_byte(r.head, 4 + j) & 63;
            w.mn = head_byte(r.head, 8 + j) & 63;
        } else {
            w.sc = (head_byte(r.head, 8 + j) & 15) | ((head_byte(r.head, j) >> 6) << 4);
            w.mn = (head_byte(r.head, 8 + j) >> 4) | ((head_byte(r.head, 4 + j) >> 6) << 4);
        }
        w.d = h2f((u16)(r.head.x & 0xFFFFu)) * (float)w.sc;
        w.m = h2f((u16)(r.head.x >> 16)) * (float)w.mn;
        u32 words[8] = {r.q0.x, r.q0.y, r.q0.z, r.q0.w, r.q1.x, r.q1.y, r.q1.z, r.q1.w};
#pragma unroll
        for (int k = 0; k < 8; ++k) w.q[k] = (words[k] >> shift) & 0x0F0F0F0Fu;
        return w;
    }
    // The same chunk loaded and decoded at once, for the GEMV: its scales by byte loads, which a
    // one-row step ran 1.5 % faster than by decode's selects from the 16-byte header.
    static __device__ __forceinline__ WChunk load(const u8* row, int c) {
        const u8* b = row + (c >> 3) * 144;
        int j = c & 7, shift = 4 * (j & 1);
        WChunk w;
        scale_min_k4(j, b + 4, &w.sc, &w.mn);
        w.d = ld_f16(b) * (float)w.sc;
        w.m = ld_f16(b + 2) * (float)w.mn;
        const U4* qs = (const U4*)(b + 16 + 32 * (j >> 1));
        U4 q0 = qs[0], q1 = qs[1];
        u32 words[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
#pragma unroll
        for (int k = 0; k < 8; ++k) w.q[k] = (words[k] >> shift) & 0x0F0F0F0Fu;
        return w;
    }
    // d · sc and dmin · m are exact in f32 (an f16 times a 6-bit integer), so decode folds them
    // into w.d and w.m and a chunk's product costs two multiplications and a fused one.
    static __device__ __forceinline__ float partial(const WChunk& w, const XScale& x, int low,
                                                    int) {
        return __fmaf_rn(w.d * x.d, (float)low, -(w.m * x.ds));
    }
};

// How a weight chunk travels from its loads to its use: by default decoded as it is loaded;
// formats with a `fetch` and `decode` (Q4_K) hold their raw words in between.
template <typename C>
struct ChunkFetch {
    typedef WChunk Raw;
    static __device__ __forceinline__ Raw fetch(const u8* row, int c) { return C::load(row, c); }
    static __device__ __forceinline__ WChunk decode(const Raw& r, int) { return r; }
};
template <>
struct ChunkFetch<ChunkQ4_K> {
    typedef ChunkQ4_K::Raw Raw;
    static __device__ __forceinline__ Raw fetch(const u8* row, int c) {
        return ChunkQ4_K::fetch(row, c);
    }
    static __device__ __forceinline__ WChunk decode(const Raw& r, int c) {
        return ChunkQ4_K::decode(r, c);
    }
};

// Q5_K: as Q4_K (176-byte super-blocks: d, dmin, 12 bytes of 6-bit scales and mins, 32 bytes
// of fifth bits, 128 of nibbles; rows are whole super-blocks, so 16-byte aligned), quants 0..31:
// the fifth bit of element l of sub-block j is bit j of qh[l].
struct ChunkQ5_K {
    static __device__ __forceinline__ WChunk load(const u8* row, int c) {
        const u8* b = row + (c >> 3) * 176;
        int j = c & 7, shift = 4 * (j & 1);
        WChunk w;
        scale_min_k4(j, b + 4, &w.sc, &w.mn);
        w.d = ld_f16(b) * (float)w.sc;
        w.m = ld_f16(b + 2) * (float)w.mn;
        const U4* qh = (const U4*)(b + 16);
        const U4* qs = (const U4*)(b + 48 + 32 * (j >> 1));
        U4 h0 = qh[0], h1 = qh[1], q0 = qs[0], q1 = qs[1];
        u32 high[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
        u32 low[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
#pragma unroll
        for (int k = 0; k < 8; ++k)
            w.q[k] = ((low[k] >> shift) & 0x0F0F0F0Fu) | (((high[k] >> j) & 0x01010101u) << 4);
        return w;
    }
    static __device__ __forceinline__ float partial(const WChunk& w, const XScale& x, int low,
                                                    int high) {
        return ChunkQ4_K::partial(w, x, low, high);
    }
};

// Q6_K: chunk c is group g of half n of super-block c / 8 (j = c mod 8 = 4n + g): its low four
// bits in the nibbles of 32 bytes at 64n + 32(g mod 2) (high nibbles for g >= 2), its top two
// bits at 2g of 32 bytes at 128 + 32n, one signed scale per 16-element half.
struct ChunkQ6_K {
    // The scale of the chunk's 16-element half `half`.
    static __device__ __forceinline__ int half_scale(const u8* b, int j, int half) {
        return (int)(signed char)b[192 + 8 * (j >> 2) + 2 * (j & 3) + half];
    }
    // Its quants less 32 (signed, -32..31) in eight words, the two halves' scales in sc and mn.
    // (The low and high bits are read whole, 32 bytes each, within the 210-byte block.)
    static __device__ __forceinline__ WChunk load(const u8* row, int c) {
        const u8* b = row + (c >> 3) * 210;
        int j = c & 7, n = j >> 2, g = j & 3;
        u32 ql[8], qh[8];
        ld_words_2<8>(b + 64 * n + 32 * (g & 1), ql);
        ld_words_2<8>(b + 128 + 32 * n, qh);
        WChunk w;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            u32 low = (ql[k] >> (g >= 2 ? 4 : 0)) & 0x0F0F0F0Fu;
            u32 high = ((qh[k] >> (2 * g)) & 0x03030303u) << 4;
            w.q[k] = __vsub4(low | high, 0x20202020u);
        }
        w.sc = half_scale(b, j, 0);
        w.mn = half_scale(b, j, 1);
        w.d = ld_f16(b + 208);
        return w;
    }
    static __device__ __forceinline__ float partial(const WChunk& w, const XScale& x, int low,
                                                    int high) {
        return (w.d * x.d) * (float)(w.sc * low + w.mn * high);
    }
};

// The product of weight chunk c and input chunk c: the integer sum over the chunk, then the
// format's formula.
template <typename C>
__device__ __forceinline__ float chunk_dot(const WChunk& w, int c, const QInput& in) {
    return C::partial(w, x_scale(in.d[c], in.sum[c], in.s[c]), chunk_sum(w, input_chunk(in, c)), 0);
}
// Q6_K: the integer sums over its two 16-element halves, as the GEMM's two m16n8k16.
template <>
__device__ __forceinline__ float chunk_dot<ChunkQ6_K>(const WChunk& w, int c, const QInput& in) {
    Chunk8 x = input_chunk(in, c);
    int low = 0, high = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        low = __dp4a((int)w.q[k], x.w[k], low);
        high = __dp4a((int)w.q[4 + k], x.w[4 + k], high);
    }
    return ChunkQ6_K::partial(w, x_scale(in.d[c], in.sum[c], in.s[c]), low, high);
}

// THE ORDER OF EVERY QUANTIZED PRODUCT (this GEMV, one row or batched, the tensor-core GEMM of
// qgemm.cu and the expert kernels alike; specs/CUDA.md, "One arithmetic"): an output's chunk
// products p_c (chunk_dot: exact integer sums, then the format's formula) are the leaves; the
// 32 leaves of each segment (QG_SEG chunks, 1,024 columns; a last, shorter segment
// has +0 leaves) are added by the pairwise tree in chunk order, ((l0 + l1) + (l2 + l3)) + …;
// the segments' totals are added in order to 0: (0 + S0) + S1 + …. Nothing in it depends on
// the number of rows, the kernel or the launch, so a row's bits are the same in every pass.
// QG_SEG (chunks a segment) and QG_MAX_SEGMENTS (segments of the widest input a launch takes)
// come from src/program.rs.

__host__ __device__ constexpr int log2_of(int w) { return w <= 1 ? 0 : 1 + log2_of(w / 2); }

// The R rows of a warp, and the sums of its R rows times T tokens, row-major (passed by value,
// indexed by unrolled constants, so they stay in registers).
template <int R>
struct Rows {
    const u8* p[R];
};
template <int N>
struct Sums {
    float v[N];
};

// This lane's leaves of chunk c (when `live`) for each of the R rows times the `count` (≤ T)
// input rows at `inputs` (qinput_bytes(cols) apart); +0 elsewhere. Each weight chunk is loaded
// once for all the tokens.
template <typename C, int R, int T>
__device__ __forceinline__ Sums<R * T> chunk_leaves(Rows<R> w, int c, bool live, int cols,
                                                    const u8* inputs, int count) {
    Sums<R * T> leaf;
#pragma unroll
    for (int k = 0; k < R * T; ++k) leaf.v[k] = 0.0f;
    if (!live) return leaf;
    int bytes = qinput_bytes(cols);
#pragma unroll
    for (int k = 0; k < R; ++k) {
        WChunk wc = C::load(w.p[k], c);
#pragma unroll
        for (int t = 0; t < T; ++t) {
            if (T > 1 && t >= count) break;
            leaf.v[k * T + t] = chunk_dot<C>(wc, c, qinput_at(cols, inputs + t * bytes));
        }
    }
    return leaf;
}

// What a launch does with its dot products: QG_STORE (y = W·x + bias), QG_ACCUMULATE (y +=
// W·x, the residual stream), QG_SILU and QG_GELU (y0 = act(gate·x) · (up·x): matrix 0 the gate,
// matrix 1 the up), QG_ROPE (Q, K, V rows in RoPE pairs: Q rotated, K rotated and V into the
// cache); src/program.rs defines the codes. A launch's matrices are QMatrix, its RoPE QRope
// (src/params.rs).

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
    float angle = rope_angle(p, i, rope.theta_scale, rope.freq_scale, rope.factors,
                             rope.yarn_low, rope.yarn_high);
    float s = sinf(angle) * rope.attn_factor, c = cosf(angle) * rope.attn_factor;
    float v0 = *x0, v1 = *x1;
    *x0 = v0 * c - v1 * s;
    *x1 = v0 * s + v1 * c;
}

// The epilogue of a RoPE launch for the pair in rows a, b of matrix `which`, token t.
__device__ __forceinline__ void rope_epilogue(const QMatrix& mq, const QMatrix& mk,
                                              const QMatrix& mv, const QRope& rope, int which,
                                              int a, int b, int rotation, float va, float vb,
                                              int t) {
    int p = rope.rows.pos[t];
    if (rotation >= 0) rotate(&va, &vb, p, rotation, rope);
    if (which == 0) {
        mq.y[t * mq.rows + a] = va;
        mq.y[t * mq.rows + b] = vb;
    } else {
        const QMatrix& m = which == 1 ? mk : mv;
        u16* cache = (which == 1 ? rope.k_cache : rope.v_cache) + step_kv_row(rope.rows, t, p) * m.rows;
        cache[a] = f2h(va);
        cache[b] = f2h(vb);
    }
}

// Matrix i of a launch (a selection, not an array index: the three stay in registers).
__device__ __forceinline__ QMatrix pick(const QMatrix& a, const QMatrix& b, const QMatrix& c, int i) {
    return i == 0 ? a : (i == 1 ? b : c);
}

// Sums each of the N values `v` over the S lanes of a sub-warp (S a power of two up to 32,
// N one up to S), leaving each lane with the total of value *index (S / N lanes hold each).
// At each xor distance S/2, …, 1 a lane keeps half of its values and adds the partner's copy
// of them: each value's total comes from the same pairs, added in the same order, as warp_sum's
// butterfly, so it is bit-identical to warp_sum of that value (with S < 32 when the other lanes
// would have held zeros: adding +0 to a sum, never -0 here, changes no bit), in log N + …
// shuffles instead of N log S. Row-major values (k · U + u) split by row first: the lanes of a
// row-1 total are those of the row-0 total xor S/2.
template <int N, int S>
__device__ __forceinline__ float reduce_scatter(Sums<N> sums, int lane, int* index) {
    float v[N];
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = sums.v[i];
    int base = 0;
    // log2 S levels.
    constexpr int LEVELS = S >= 32 ? 5 : S >= 16 ? 4 : S >= 8 ? 3 : S >= 4 ? 2 : S >= 2 ? 1 : 0;
#pragma unroll
    for (int level = 0; level < LEVELS; ++level) {
        int o = (S / 2) >> level, count = N >> level;
        if (count > 1) {
            int half = count / 2;
            bool upper = (lane & o) != 0;
#pragma unroll
            for (int i = 0; i < half; ++i) {
                float low = v[i], high = v[half + i];
                float send = upper ? low : high, keep = upper ? high : low;
                v[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
            }
            if (upper) base += half;
        } else {
            v[0] += __shfl_xor_sync(0xffffffffu, v[0], o);
        }
    }
    *index = base;
    return v[0];
}

// What a launch does with the total v of row k (of the warp's R; `last` = R - 1) for token t,
// `other` the total of the warp's other row for the same token (R = 2): stored (+ bias),
// accumulated, gated (k = 0: the gate, other: the up), or rotated and cached (k = 0: the
// pair's first row, other: its second).
__device__ __forceinline__ void qgemv_epilogue(const QMatrix& m0, const QMatrix& m1,
                                               const QMatrix& m2, const QRope& rope, int mode,
                                               const int* which, const int* row,
                                               const bool* valid, int rotation, int last, int k,
                                               float v, float other, int t) {
    long long tl = t;
    if (mode == QG_ROPE) {
        if (k != 0 || !valid[0]) return;
        QMatrix mb = pick(m0, m1, m2, which[0]);
        float va = v, vb = other;
        if (mb.bias) {
            va = va + mb.bias[row[0]];
            vb = vb + mb.bias[row[last]];
        }
        rope_epilogue(m0, m1, m2, rope, which[0], row[0], row[last], rotation, va, vb, t);
        return;
    }
    if (mode == QG_SILU || mode == QG_GELU) {
        if (k == 0 && valid[0])
            m0.y[tl * m0.rows + row[0]] = (mode == QG_GELU ? gelu_tanh(v) : silu(v)) * other;
        return;
    }
    if (!valid[k]) return;
    QMatrix mk = pick(m0, m1, m2, which[k]);
    if (mk.bias) v = v + mk.bias[row[k]];
    float* dst = mk.y + tl * mk.rows + row[k];
    *dst = mode == QG_ACCUMULATE ? *dst + v : v;
}

// The pieces of a row: with P warps on a row ("parts"), warp p takes piece p of every segment,
// its chunks p·W.. < (p + 1)·W (W = 32 / P), a subtree of the segment's tree; its W-lane groups
// take segments j, j + P, … (j the group). Lane l of a group takes the piece's chunk rev(l)
// (its log2 W bits reversed), so that the butterfly of reduce_scatter (xor W/2 first) adds the
// chunks' leaves in the tree's pairs. P = 1: each lane ends with the sequential total of its
// value *index over all segments; P > 1: the leaders write each segment's piece total to
// pieces[value][segment] and the caller adds the pieces (piece_tree) and the segments. With
// S = P token groups (a row of one segment, which would leave all groups but the first idle),
// every group takes that segment instead, group j on tokens j·T/S.. of the block.
template <typename C, int R, int T, int P, int S>
__device__ __forceinline__ float row_pieces(Rows<R> w, int piece, int lane, int cols,
                                            const u8* inputs, int count,
                                            float (*pieces)[QG_MAX_SEGMENTS], int* index) {
    constexpr int W = 32 / P, U = T / S, N = R * U;
    static_assert(N <= W, "each value's total in W / N lanes");
    static_assert(S == 1 || (S == P && P > 1), "token groups share one segment");
    int group = lane / W, l = lane % W, first = S > 1 ? group * U : 0;
    int offset = piece * W + (W == 1 ? 0 : (int)(__brev((u32)l) >> (32 - log2_of(W))));
    int chunks = cols >> 5, segments = (chunks + QG_SEG - 1) / QG_SEG;
    bool leader = (l & (W / N - 1)) == 0;
    const u8* mine = inputs + (long long)first * qinput_bytes(cols);
    float total = 0.0f;
    // Every lane runs every round (the shuffles take the whole warp).
    for (int s0 = 0; s0 < segments; s0 += S > 1 ? 1 : P) {
        int s = S > 1 ? s0 : s0 + group, c = s * QG_SEG + offset;
        Sums<N> leaves =
            chunk_leaves<C, R, U>(w, c, s < segments && c < chunks, cols, mine, count - first);
        float v = reduce_scatter<N, W>(leaves, l, index);
        if (P == 1) {
            total = total + v;
        } else if (leader && s < segments) {
            pieces[(*index / U) * T + first + *index % U][s] = v;
        }
    }
    return total;
}

// row_pieces for the warp's format (the same for its R rows), chosen once per warp.
template <int R, int T, int P, int S>
__device__ __forceinline__ float row_pieces_of(int format, Rows<R> w, int piece, int lane,
                                               int cols, const u8* inputs, int count,
                                               float (*pieces)[QG_MAX_SEGMENTS], int* index) {
#define QG_PIECES(C, ...) return row_pieces<C, R, T, P, S>(__VA_ARGS__)
    LLORCH_CHUNK_SWITCH(format, QG_PIECES, w, piece, lane, cols, inputs, count, pieces, index)
#undef QG_PIECES
}

// The total of this lane's value *index (of the R rows × T tokens) over a whole row, the warp
// alone on it; each value is held by the 32 / (R·T) lanes of one group, of which the first
// (lane mod 32 / (R·T) = 0) speaks for it, and the lanes of a row-1 total are those of the
// row-0 total xor 16.
template <int R, int T>
__device__ __forceinline__ float warp_row_totals(int format, Rows<R> w, int lane, int cols,
                                                 const u8* inputs, int count, int* index) {
    return row_pieces_of<R, T, 1, 1>(format, w, 0, lane, cols, inputs, count, nullptr, index);
}

// A segment's total from its P pieces at p[0], p[stride], …: the top levels of its tree.
template <int P>
__device__ __forceinline__ float piece_tree(const float* p, int stride) {
    if (P == 1) return p[0];
    if (P == 2) return p[0] + p[stride];
    float a = (p[0] + p[stride]) + (p[2 * stride] + p[3 * stride]);
    if (P == 4) return a;
    return a + ((p[4 * stride] + p[5 * stride]) + (p[6 * stride] + p[7 * stride]));
}

// R rows per warp-slot (R = 2: two consecutive rows of the concatenated matrices, which must
// then share one format, or with a gated mode a gate row and its up row), P warps per slot
// (pieces of the segments, added through shared memory), blockDim.x / 32 warps per block (at
// most QG_WARPS), S token groups (row_pieces); grid.x over groups of T of the n tokens, grid.y
// over slots, so that the blocks reading the same weights for different tokens run side by
// side and DRAM serves each weight once (the others hit L2).
template <int R, int T, int P, int S>
__device__ void qgemv(const QMatrix& m0, const QMatrix& m1, const QMatrix& m2, const QRope& rope,
                      int cols, int n, const float* x, const u8* pre, const float* norm,
                      float eps, int mode) {
    constexpr int N = R * T;
    extern __shared__ int4 qgemv_shared[];
    __shared__ float s_pieces[P > 1 ? QG_WARPS : 1][N][QG_MAX_SEGMENTS];
    int t0 = blockIdx.x * T, count = min(T, n - t0);
    const u8* inputs = load_inputs<T>(x, pre, norm, eps, cols, t0, (u8*)qgemv_shared);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, part = warp % P;
    int slot = blockIdx.y * ((blockDim.x >> 5) / P) + warp / P;
    bool gated = mode == QG_SILU || mode == QG_GELU, roped = mode == QG_ROPE;
    int all_rows = gated ? m0.rows : m0.rows + m1.rows + m2.rows;
    int which[R], row[R], format = 0, rotation = -1;
    bool valid[R];
    Rows<R> w;
    if (roped) {
        // R is 2: the slot is a pair.
        valid[0] = valid[R - 1] = 2 * slot < all_rows;
        which[0] = which[R - 1] =
            rope_pair(m0, m1, rope, valid[0] ? slot : 0, &row[0], &row[R - 1], &rotation);
    }
#pragma unroll
    for (int k = 0; k < R; ++k) {
        int r = gated ? slot : R * slot + k;
        if (!roped) valid[k] = r < all_rows;
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
    int index;
    float total = row_pieces_of<R, T, P, S>(format, w, part, lane, cols, inputs, count,
                                            s_pieces[P > 1 ? warp : 0], &index);
    bool leader = (lane & (32 / N - 1)) == 0;
    int partner = 16;  // the lanes of the other row's total for the same token (R = 2)
    if (P > 1) {
        __syncthreads();
        if (part != 0) return;
        // Lane v (< N) adds value v's pieces, segment by segment.
        int segments = ((cols >> 5) + QG_SEG - 1) / QG_SEG;
        index = lane % N;
        leader = lane < N;
        partner = T;
        total = 0.0f;
        const float* first = &s_pieces[warp][index][0];
        for (int s = 0; s < segments; ++s)
            total = total + piece_tree<P>(first + s, N * QG_MAX_SEGMENTS);
    }
    float other = R == 2 ? __shfl_xor_sync(0xffffffffu, total, partner) : 0.0f;
    int k = index / T, i = index % T;
    if (!leader || i >= count) return;
    qgemv_epilogue(m0, m1, m2, rope, mode, which, row, valid, rotation, R - 1, R == 2 ? k : 0,
                   total, other, t0 + i);
}

#define QGEMV_KERNEL(R, T, P, S)                                                                   \
    extern "C" __global__ void __launch_bounds__(QG_WARPS * 32) qgemv_r##R##_t##T##_p##P##_s##S(   \
        const __grid_constant__ QgemvParams p) {                                                   \
        qgemv<R, T, P, S>(p.m0, p.m1, p.m2, p.rope, p.cols, p.n, p.x, p.pre, p.norm, p.eps,        \
                          p.mode);                                                                 \
    }

QGEMV_KERNEL(1, 1, 1, 1)
QGEMV_KERNEL(2, 1, 1, 1)
QGEMV_KERNEL(1, 1, 2, 1)
QGEMV_KERNEL(2, 1, 2, 1)
QGEMV_KERNEL(1, 1, 4, 1)
QGEMV_KERNEL(2, 1, 4, 1)
QGEMV_KERNEL(1, 1, 8, 1)
QGEMV_KERNEL(2, 1, 8, 1)
QGEMV_KERNEL(1, 8, 1, 1)
QGEMV_KERNEL(2, 8, 1, 1)
QGEMV_KERNEL(1, 8, 2, 1)
QGEMV_KERNEL(2, 8, 2, 1)
QGEMV_KERNEL(1, 8, 2, 2)
QGEMV_KERNEL(2, 8, 2, 2)
