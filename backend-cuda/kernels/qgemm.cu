// The int8 tensor-core GEMM: every weight row of up to three matrices times every token row of
// a pass, for the quantized formats of qgemv.cu, with qgemv's launch modes (store, accumulate,
// gated, RoPE). The token rows come quantized once by quantize_rows (32-element int8 chunks with
// a scale d, the sum of their quants and s, as the CPU's activation blocks). A block takes a
// tile of BM weight rows × BN tokens: it decodes QM_KC weight chunks per row to int8 in shared
// memory with the GEMV's loaders, copies the tokens' chunks beside them, and each chunk's
// integer sums come from mma.sync (s8 × s8 → s32, exact). Each output then follows qgemv.cu's
// order exactly (its chunk products by the format's formula, the pairwise tree within each
// segment of QG_SEG chunks, the segments in order), so a row's bits are those of the GEMV and
// do not depend on the rows beside it, the tile or the launch. A block runs one segment
// (grid.z) and the last block of a tile to finish adds the segments' totals, so a prompt of a
// few dozen tokens still fills the GPU on a wide matrix (a down projection).

// Weight chunks (32 elements) per row and tile step: each step's loads, fetched while the
// previous step multiplies, are in flight together.
#define QM_KC 8
// Chunks per segment (qgemv.cu's order): four tile steps.
#define QM_SEG QG_SEG
// Bytes per row of a tile in shared memory: QM_KC chunks of 32 quants, plus 16 so that the
// eight rows of a fragment load fall in distinct banks.
#define QM_PITCH (QM_KC * 32 + 16)

// A block's shape: WM × WN warps, each on MT 16-row × NT 8-token mma tiles, BLOCKS of them
// resident per SM (the register budget __launch_bounds__ gives each thread). Small tiles give a
// prompt of a few dozen tokens many blocks (one SM per large tile left most of the GPU idle);
// large ones load and scale less per output for long prompts.
template <int WARPS_M, int WARPS_N, int TILES_M, int TILES_N, int MIN_BLOCKS>
struct QmShape {
    static const int WM = WARPS_M, WN = WARPS_N, MT = TILES_M, NT = TILES_N, BLOCKS = MIN_BLOCKS;
    static const int THREADS = WM * WN * 32, BM = WM * MT * 16, BN = WN * NT * 8;
    // Outputs each thread holds.
    static const int V = MT * NT * 4;
    // (row, chunk) and (token, chunk) pairs each thread fetches per step.
    static const int WPAIRS = BM * QM_KC / THREADS, XPAIRS = BN * QM_KC / THREADS;
    static_assert(WPAIRS >= 1 && XPAIRS >= 1 && BM * QM_KC % THREADS == 0 &&
                      BN * QM_KC % THREADS == 0,
                  "pairs split evenly");
};
// QM_WARPS_M, QM_WARPS_N, QM_LARGE_MT and QM_LARGE_NT come from src/program.rs.
typedef QmShape<QM_WARPS_M, QM_WARPS_N, 1, 1, 4> QmSmall;  // 32 × 32, 8 warps
typedef QmShape<QM_WARPS_M, QM_WARPS_N, QM_LARGE_MT, QM_LARGE_NT, 2> QmLarge;

// A weight chunk's scales and a token chunk's (XScale), 16 bytes each,
// so that a warp reads them with one load per row or token (four and three scalar loads made
// the shared loads, not DRAM, the wall of a 16-row decode step).
struct __align__(16) QmWScale {
    float d, m;
    int sc, mn;
};

// Scales sit QM_KC + 1 to a row (or token): the 16-byte rows' starts 36 words apart put a
// warp's eight rows (or four tokens two apart) of one chunk in distinct banks, and a thread's
// eight chunks of one row side by side when it stores them.
template <typename S>
struct QmTiles {
    u8 wq[S::BM * QM_PITCH];
    u8 xq[S::BN * QM_PITCH];
    QmWScale ws[S::BM][QM_KC + 1];
    XScale xsc[S::BN][QM_KC + 1];
};

// c += a · b for a 16×32 tile of weights (row-major, 4 quants per word) and a 32×8 tile of
// tokens (one column of 32 quants per token): mma's m16n8k32 fragments.
__device__ __forceinline__ void mma_k32(int* c, const int* a, const int* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The same over 16 of the 32 elements (m16n8k16), for formats scaled per 16-element half.
__device__ __forceinline__ void mma_k16(int* c, int a0, int a1, int b0) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
        "{%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(b0));
}

// Whether format C scales the two 16-element halves of a chunk apart (Q6_K).
template <typename C>
struct QmHalves {
    static const bool value = false;
};
template <>
struct QmHalves<ChunkQ6_K> {
    static const bool value = true;
};

// F<C, S>(args...) for the chunk type C of ggml format id `format` (src/formats.rs).
#define QM_CALL(C, F, S, ...) F<C, S>(__VA_ARGS__)
#define QM_DISPATCH(format, F, S, ...) LLORCH_CHUNK_SWITCH(format, QM_CALL, F, S, __VA_ARGS__)

// What a block multiplies: its matrix (one format), and for each of the rows of its weight tile
// the row it holds. In the gated and RoPE modes each 16-row mma tile holds the first rows
// of 8 output slots in its rows 0..7 and their second rows in 8..15 (gate and up row; the two
// rows a RoPE pair rotates together), so that one thread holds both results of a slot.
struct QmBlock {
    QMatrix m;
    int slot0;    // first slot (output row, or pair for RoPE) of the block in its matrix
    int slots;    // slots of the matrix
    int pair0;    // RoPE: index of the matrix's first pair among the launch's pairs
};

// Row r of the weight tile: its matrix's row (and, for RoPE, which matrix and the rotation).
__device__ __forceinline__ int qm_tile_row(const QmBlock& b, const QMatrix& m0, const QMatrix& m1,
                                           const QRope& rope, int mode, int r, int* which,
                                           int* rotation) {
    int slot = b.slot0 + (r >> 4) * 8 + (r & 7), second = (r >> 3) & 1;
    if (mode == QG_STORE || mode == QG_ACCUMULATE) return min(b.slot0 + r, b.m.rows - 1);
    slot = min(slot, b.slots - 1);
    if (mode != QG_ROPE) return slot;  // gated: gate row r (first) or up row r (second)
    int a, c;
    *which = rope_pair(m0, m1, rope, b.pair0 + slot, &a, &c, rotation);
    return second ? c : a;
}

// The weight pointer of tile row r (gated: the second rows from m1, the up matrix; RoPE: both
// rows of a pair from the block's matrix).
__device__ __forceinline__ const u8* qm_row_ptr(const QmBlock& b, const QMatrix& m1, int mode,
                                                int r, int row) {
    bool up = (mode == QG_SILU || mode == QG_GELU) && ((r >> 3) & 1);
    const QMatrix& m = up ? m1 : b.m;
    return m.w + (long long)row * m.row_bytes;
}

// One thread's share of a tile step in registers: S::WPAIRS weight chunks (as ChunkFetch<C>
// holds them: raw where the format decodes apart, so the loads stay in flight while the block
// multiplies the previous step) and token chunks.
template <typename C, typename S>
struct QmStage {
    typename ChunkFetch<C>::Raw w[S::WPAIRS];
    int4 x0[S::XPAIRS], x1[S::XPAIRS];
    float xd[S::XPAIRS], xs[S::XPAIRS];
    int xsum[S::XPAIRS];
};

// Pair i of this thread: tile row or token (threadIdx.x + i · threads) / QM_KC, chunk
// threadIdx.x mod QM_KC.
template <typename S>
__device__ __forceinline__ int qm_pair_row(int i) {
    return (threadIdx.x + i * S::THREADS) / QM_KC;
}

// This thread's chunks of step k0 (kc chunks): its weight rows' (at `wrows`) loaded (ChunkFetch), its
// tokens' copied (tokens past the end repeat the last one, or are zeros where their warp sits
// idle; their results are not stored).
template <typename C, typename S>
__device__ __forceinline__ void qm_fetch(QmStage<C, S>& st, const u8* const* wrows, int t0, int n,
                                         int cols, const u8* pre, int k0, int kc) {
    int c = threadIdx.x % QM_KC;
    if (c >= kc) return;
#pragma unroll
    for (int i = 0; i < S::WPAIRS; ++i) st.w[i] = ChunkFetch<C>::fetch(wrows[i], k0 + c);
#pragma unroll
    for (int i = 0; i < S::XPAIRS; ++i) {
        // The tokens of a warp that will sit idle (qm_products) are not read.
        int r = qm_pair_row<S>(i);
        if (t0 + (r & ~(8 * S::NT - 1)) >= n) {
            st.x0[i] = st.x1[i] = int4{0, 0, 0, 0};
            st.xd[i] = st.xs[i] = 0.0f;
            st.xsum[i] = 0;
            continue;
        }
        int t = min(t0 + r, n - 1);
        const u8* base = pre + (long long)t * qinput_bytes(cols);
        QInput in = qinput_at(cols, base);
        const int4* src = (const int4*)(base + 32 * (k0 + c));
        st.x0[i] = src[0];
        st.x1[i] = src[1];
        st.xd[i] = in.d[k0 + c];
        st.xsum[i] = in.sum[k0 + c];
        st.xs[i] = in.s[k0 + c];
    }
}

template <typename C, typename S>
__device__ __forceinline__ void qm_store(QmTiles<S>& sh, const QmStage<C, S>& st, int k0, int kc) {
    int c = threadIdx.x % QM_KC;
    if (c >= kc) return;
#pragma unroll
    for (int i = 0; i < S::WPAIRS; ++i) {
        int r = qm_pair_row<S>(i);
        WChunk w = ChunkFetch<C>::decode(st.w[i], k0 + c);
        int4* dst = (int4*)(sh.wq + r * QM_PITCH + 32 * c);
        dst[0] = int4{(int)w.q[0], (int)w.q[1], (int)w.q[2], (int)w.q[3]};
        dst[1] = int4{(int)w.q[4], (int)w.q[5], (int)w.q[6], (int)w.q[7]};
        sh.ws[r][c] = QmWScale{w.d, w.m, w.sc, w.mn};
    }
#pragma unroll
    for (int i = 0; i < S::XPAIRS; ++i) {
        int r = qm_pair_row<S>(i);
        int4* xdst = (int4*)(sh.xq + r * QM_PITCH + 32 * c);
        xdst[0] = st.x0[i];
        xdst[1] = st.x1[i];
        sh.xsc[r][c] = x_scale(st.xd[i], st.xsum[i], st.xs[i]);
    }
}

// The leaves (the chunk products, qgemv.cu's order) of chunk c of the tiles for the warp's
// rows wm.. and tokens wn.. (mma tile mt, nt; output i: row g, +8 for i ≥ 2; token 2·q4 + (i & 1)).
template <typename C, typename S>
__device__ __forceinline__ void qm_chunk(const QmTiles<S>& sh, int c, int wm, int wn, int g,
                                         int q4, float (*leaf)[S::NT][4]) {
    int a[S::MT][4];
    WChunk w[S::MT][2];
#pragma unroll
    for (int mt = 0; mt < S::MT; ++mt) {
        const u8* pa = sh.wq + (wm + 16 * mt + g) * QM_PITCH + 32 * c + 4 * q4;
        a[mt][0] = *(const int*)pa;
        a[mt][1] = *(const int*)(pa + 8 * QM_PITCH);
        a[mt][2] = *(const int*)(pa + 16);
        a[mt][3] = *(const int*)(pa + 8 * QM_PITCH + 16);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            int r = wm + 16 * mt + g + 8 * h;
            QmWScale ws = sh.ws[r][c];
            w[mt][h].d = ws.d;
            w[mt][h].m = ws.m;
            w[mt][h].sc = ws.sc;
            w[mt][h].mn = ws.mn;
        }
    }
#pragma unroll
    for (int nt = 0; nt < S::NT; ++nt) {
        int x = wn + 8 * nt;
        const u8* pb = sh.xq + (x + g) * QM_PITCH + 32 * c + 4 * q4;
        int b[2] = {*(const int*)pb, *(const int*)(pb + 16)};
        XScale xsc[2];
#pragma unroll
        for (int j = 0; j < 2; ++j) xsc[j] = sh.xsc[x + 2 * q4 + j][c];
#pragma unroll
        for (int mt = 0; mt < S::MT; ++mt) {
            int low[4] = {0, 0, 0, 0}, high[4] = {0, 0, 0, 0};
            if (QmHalves<C>::value) {
                mma_k16(low, a[mt][0], a[mt][1], b[0]);
                mma_k16(high, a[mt][2], a[mt][3], b[1]);
            } else {
                mma_k32(low, a[mt], b);
            }
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                leaf[mt][nt][i] = C::partial(w[mt][i >> 1], xsc[i & 1], low[i], high[i]);
            }
        }
    }
}

// What the block does with the totals of its warp's tile rows and tokens.
template <typename S>
__device__ __forceinline__ void qm_epilogue(const QmBlock& b, const QMatrix& m0,
                                            const QMatrix& m1, const QMatrix& m2,
                                            const QRope& rope, int mode, int wm, int wn, int g,
                                            int q4, int t0, int n, float (*acc)[S::NT][4]) {
    bool paired = mode != QG_STORE && mode != QG_ACCUMULATE;
#pragma unroll
    for (int mt = 0; mt < S::MT; ++mt) {
#pragma unroll
        for (int nt = 0; nt < S::NT; ++nt) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                int t = t0 + wn + 8 * nt + 2 * q4 + (i & 1);
                if (t >= n) continue;
                float v = acc[mt][nt][i];
                if (!paired) {
                    int r = b.slot0 + wm + 16 * mt + g + 8 * (i >> 1);
                    if (r >= b.m.rows) continue;
                    if (b.m.bias) v = v + b.m.bias[r];
                    float* dst = b.m.y + (long long)t * b.m.rows + r;
                    *dst = mode == QG_ACCUMULATE ? *dst + v : v;
                    continue;
                }
                // Slot 8·(mma tile) + g: its first row's total in outputs 0, 1, the second's
                // in 2, 3.
                int slot = b.slot0 + ((wm >> 4) + mt) * 8 + g;
                if (i >= 2 || slot >= b.slots) continue;
                float second = acc[mt][nt][i + 2];
                if (mode != QG_ROPE) {
                    float act = mode == QG_GELU ? gelu_tanh(v) : silu(v);
                    m0.y[(long long)t * m0.rows + slot] = act * second;
                    continue;
                }
                int a, c, rotation;
                int which = rope_pair(m0, m1, rope, b.pair0 + slot, &a, &c, &rotation);
                const QMatrix& mb = pick(m0, m1, m2, which);
                if (mb.bias) {
                    v = v + mb.bias[a];
                    second = second + mb.bias[c];
                }
                rope_epilogue(m0, m1, m2, rope, which, a, c, rotation, v, second, t);
            }
        }
    }
}

template <typename S>
__device__ __forceinline__ void qm_set(float (*dst)[S::NT][4], const float (*src)[S::NT][4]) {
#pragma unroll
    for (int v = 0; v < S::V; ++v)
        dst[v / (4 * S::NT)][(v / 4) % S::NT][v % 4] = src[v / (4 * S::NT)][(v / 4) % S::NT][v % 4];
}

// dst = dst + src, output by output (the left operand the earlier subtree).
template <typename S>
__device__ __forceinline__ void qm_add(float (*dst)[S::NT][4], const float (*src)[S::NT][4]) {
#pragma unroll
    for (int v = 0; v < S::V; ++v) {
        float& d = dst[v / (4 * S::NT)][(v / 4) % S::NT][v % 4];
        d = d + src[v / (4 * S::NT)][(v / 4) % S::NT][v % 4];
    }
}

template <typename S>
__device__ __forceinline__ void qm_zero(float (*acc)[S::NT][4]) {
#pragma unroll
    for (int v = 0; v < S::V; ++v) acc[v / (4 * S::NT)][(v / 4) % S::NT][v % 4] = 0.0f;
}

// Split segments: each block stores its segment's totals at `partial` (per tile, segment,
// output and thread); the last of a tile's blocks to finish (a count per tile, left zeroed for
// the next launch, as argmax_logits's) adds them in segment order into acc (0 + S0 + S1 + …,
// as qgemv.cu) and goes on to the epilogue; the others return false.
template <typename S>
__device__ bool qm_gather(float* partial, u32* counters, float (*acc)[S::NT][4]) {
    __shared__ int s_last;
    long long tile = (long long)blockIdx.y * gridDim.x + blockIdx.x;
    float* mine = partial + ((tile * gridDim.z + blockIdx.z) * S::V) * S::THREADS + threadIdx.x;
#pragma unroll
    for (int v = 0; v < S::V; ++v) mine[v * S::THREADS] = acc[v / (4 * S::NT)][(v / 4) % S::NT][v % 4];
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        s_last = atomicAdd(counters + tile, 1u) == gridDim.z - 1;
        if (s_last) counters[tile] = 0;
    }
    __syncthreads();
    if (!s_last) return false;
    __threadfence();
    const float* all = partial + tile * gridDim.z * S::V * S::THREADS + threadIdx.x;
#pragma unroll
    for (int v = 0; v < S::V; ++v) {
        float total = 0.0f;
        for (int z = 0; z < (int)gridDim.z; ++z) total = total + __ldcg(all + (z * S::V + v) * S::THREADS);
        acc[v / (4 * S::NT)][(v / 4) % S::NT][v % 4] = total;
    }
    return true;
}

// Leaf c (of a tile step's QM_KC) into the step's pairwise tree: a holds the finished left
// subtrees, b and d the ones under way; after c = 7, a is the step's total (three levels).
template <typename S>
__device__ __forceinline__ void qm_step_tree(int c, const float (*leaf)[S::NT][4],
                                             float (*a)[S::NT][4], float (*b)[S::NT][4],
                                             float (*d)[S::NT][4]) {
    switch (c) {
        case 0: qm_set<S>(a, leaf); break;
        case 1: qm_add<S>(a, leaf); break;
        case 2: case 4: qm_set<S>(b, leaf); break;
        case 3: qm_add<S>(b, leaf); qm_add<S>(a, b); break;
        case 5: qm_add<S>(b, leaf); break;
        case 6: qm_set<S>(d, leaf); break;
        default: qm_add<S>(d, leaf); qm_add<S>(b, d); qm_add<S>(a, b); break;
    }
}

// The sums of the tile rows at `wrows` times tokens t0.. of the n at `pre` over the segments
// of chunks first.. < end (first at a segment's start), into acc: warp w on tile rows
// 16·MT·(w mod WM).. and tokens 8·NT·(w / WM)... Each thread fetches its share of the next
// tile step into registers while the block multiplies the current one. Chunks past `end` are
// +0 leaves; a segment's four steps are the top two levels of its tree ((s0 + s1) + (s2 + s3)),
// and the segments are added in order (0 + S0 + S1 + …): qgemv.cu's order.
template <typename C, typename S>
__device__ void qm_products(QmTiles<S>& sh, const u8* const* wrows, int t0, int n, int cols,
                            const u8* pre, int first, int end, float (*acc)[S::NT][4]) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q4 = lane & 3;
    int wm = (warp % S::WM) * 16 * S::MT, wn = (warp / S::WM) * 8 * S::NT;
    float a[S::MT][S::NT][4], b[S::MT][S::NT][4], d[S::MT][S::NT][4];
    float u[S::MT][S::NT][4], v[S::MT][S::NT][4];
    // A warp whose tokens are all past the n (a decode step of 16 rows leaves half a 32-token
    // tile empty) only fetches and keeps the barriers: its outputs are never stored.
    bool idle = t0 + wn >= n;
    qm_zero<S>(acc);
    QmStage<C, S> st;
    qm_fetch<C, S>(st, wrows, t0, n, cols, pre, first, min(QM_KC, end - first));
    for (int k0 = first; k0 < end; k0 += QM_KC) {
        int kc = min(QM_KC, end - k0), step = (k0 / QM_KC) % (QM_SEG / QM_KC);
        qm_store<C, S>(sh, st, k0, kc);
        __syncthreads();
        if (k0 + QM_KC < end)
            qm_fetch<C, S>(st, wrows, t0, n, cols, pre, k0 + QM_KC, min(QM_KC, end - k0 - QM_KC));
        if (idle) {
            __syncthreads();
            continue;
        }
        // Unrolled, so that one chunk's loads and mma overlap another's scaling.
#pragma unroll
        for (int c = 0; c < QM_KC; ++c) {
            float leaf[S::MT][S::NT][4];
            if (c < kc) {
                qm_chunk<C, S>(sh, c, wm, wn, g, q4, leaf);
            } else {
                qm_zero<S>(leaf);
            }
            qm_step_tree<S>(c, leaf, a, b, d);
        }
        __syncthreads();
        if (step == 0) {
            qm_set<S>(u, a);
            qm_zero<S>(v);
        } else if (step == 1) {
            qm_add<S>(u, a);
        } else if (step == 2) {
            qm_set<S>(v, a);
        } else {
            qm_add<S>(v, a);
        }
        // The segment ends: add its total.
        if (step == QM_SEG / QM_KC - 1 || k0 + QM_KC >= end) {
            qm_add<S>(u, v);
            qm_add<S>(acc, u);
        }
    }
}

// The weight row of each of this thread's fetch pairs for the block's tile (b; gated and RoPE
// layouts as qm_tile_row).
template <typename S>
__device__ __forceinline__ void qm_tile_rows(const QmBlock& b, const QMatrix& m0,
                                             const QMatrix& m1, const QRope& rope, int mode,
                                             const u8** wrows) {
#pragma unroll
    for (int i = 0; i < S::WPAIRS; ++i) {
        int r = qm_pair_row<S>(i), which = 0, rotation = 0;
        int row = qm_tile_row(b, m0, m1, rope, mode, r, &which, &rotation);
        wrows[i] = qm_row_ptr(b, m1, mode, r, row);
    }
}

// Tile b of the block's matrix times tokens blockIdx.x · BN.. of the n at `pre`, one segment
// per block when grid.z > 1 (the small shape), else all of them.
template <typename C, typename S>
__device__ void qgemm_tile(QmTiles<S>& sh, const QmBlock& b, const QMatrix& m0, const QMatrix& m1,
                           const QMatrix& m2, const QRope& rope, int mode, int cols, int n,
                           const u8* pre, float* partial, u32* counters) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q4 = lane & 3;
    int wm = (warp % S::WM) * 16 * S::MT, wn = (warp / S::WM) * 8 * S::NT;
    int t0 = blockIdx.x * S::BN, chunks = cols >> 5;
    const u8* wrows[S::WPAIRS];
    qm_tile_rows<S>(b, m0, m1, rope, mode, wrows);
    float acc[S::MT][S::NT][4];
    bool split = gridDim.z > 1;
    int first = split ? blockIdx.z * QM_SEG : 0, end = split ? min(chunks, first + QM_SEG) : chunks;
    qm_products<C, S>(sh, wrows, t0, n, cols, pre, first, end, acc);
    if (split && !qm_gather<S>(partial, counters, acc)) return;
    qm_epilogue<S>(b, m0, m1, m2, rope, mode, wm, wn, g, q4, t0, n, acc);
}

// The block's matrix and first slot: grid.y runs over the tiles of m0, then m1, then m2 (BM
// rows each; in the gated mode BM / 2 gate·up slots of m0 and m1; RoPE: BM / 2 pairs of each
// matrix).
__device__ __forceinline__ QmBlock qm_block(const QMatrix& m0, const QMatrix& m1,
                                            const QMatrix& m2, int mode, int bm) {
    bool paired = mode != QG_STORE && mode != QG_ACCUMULATE;
    bool gated = paired && mode != QG_ROPE;
    int per_tile = paired ? bm / 2 : bm, tile = blockIdx.y, pair0 = 0;
    QMatrix ms[3] = {m0, m1, m2};
    int count = gated ? 1 : 3;
    for (int i = 0; i < count; ++i) {
        int slots = mode == QG_ROPE ? ms[i].rows / 2 : ms[i].rows;
        int tiles = (slots + per_tile - 1) / per_tile;
        if (tile < tiles || i == count - 1) return QmBlock{ms[i], tile * per_tile, slots, pair0};
        tile -= tiles;
        pair0 += slots;
    }
    return QmBlock{m0, 0, 0, 0};
}

// Inlined into each kernel: as a call (what ptxas chose once the ninth format joined the
// dispatch) it took its arguments through a 416-byte stack frame and spilled more, and an
// 8B-shaped 16-row decode step went from 14.9 to 18.3 ms.
template <typename S>
__device__ __forceinline__ void qgemm(const QMatrix& m0, const QMatrix& m1, const QMatrix& m2, const QRope& rope,
                      int cols, int n, const u8* pre, int mode, float* partial, u32* counters) {
    __shared__ __align__(16) QmTiles<S> sh;
    QmBlock b = qm_block(m0, m1, m2, mode, S::BM);
    QM_DISPATCH(b.m.format, qgemm_tile, S, sh, b, m0, m1, m2, rope, mode, cols, n, pre, partial,
                counters);
}

// The launch of one format's matrices: the block's chunk type known at compile time. With the
// one code path instead of the dispatch's nine, the tile's accumulators stay in registers (40
// bytes of spills against 816 for the dispatching kernel, ptxas at sm_90).
template <typename S, typename C>
__device__ __forceinline__ void qgemm_one(const QMatrix& m0, const QMatrix& m1,
                                          const QMatrix& m2, const QRope& rope, int cols, int n,
                                          const u8* pre, int mode, float* partial,
                                          u32* counters) {
    __shared__ __align__(16) QmTiles<S> sh;
    QmBlock b = qm_block(m0, m1, m2, mode, S::BM);
    qgemm_tile<C, S>(sh, b, m0, m1, m2, rope, mode, cols, n, pre, partial, counters);
}

// A kernel over up to three matrices whose launch runs CALL (on copies of the parameters'
// matrices and rotation, as the one-row kernels take them).
#define QGEMM_KERNEL(NAME, SHAPE, CALL)                                                            \
    extern "C" __global__ void __launch_bounds__(SHAPE::THREADS, SHAPE::BLOCKS) NAME(              \
        const __grid_constant__ QgemmParams p) {                                                   \
        CALL(p.m0, p.m1, p.m2, p.rope, p.cols, p.n, p.pre, p.mode, p.partial, p.counters);         \
    }

// For each tile shape: any mix of formats (`qgemm_<shape>`; a Q4_K_M model's Q·K·V: Q4_K, Q4_K,
// Q6_K), each block dispatching on its matrix's format; and one kernel per int8 dense format of
// src/formats.rs (`qgemm_<shape>_<suffix>`) for launches of one format.
#define QGEMM_ONE_FORMAT(C, suffix, SHAPE_NAME, SHAPE) \
    QGEMM_KERNEL(qgemm_##SHAPE_NAME##_##suffix, SHAPE, (qgemm_one<SHAPE, C>))
#define QGEMM_SHAPE_KERNELS(SHAPE_NAME, SHAPE)                    \
    QGEMM_KERNEL(qgemm_##SHAPE_NAME, SHAPE, qgemm<SHAPE>)         \
    LLORCH_INT8_DENSE_FORMATS(QGEMM_ONE_FORMAT, SHAPE_NAME, SHAPE)

QGEMM_SHAPE_KERNELS(small, QmSmall)
QGEMM_SHAPE_KERNELS(large, QmLarge)
