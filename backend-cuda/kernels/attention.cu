// Causal (optionally sliding-window) attention over one layer of the f16 KV pool, by two
// kernels that give a query row the same bits: attention_rows for a pass of long chunks (a block
// on a tile of rows sharing each tile of keys) and attention_split for decodes (a row's keys
// spread over blocks, flash-decoding). THE ORDER, fixed by the row's position and window alone
// (specs/CUDA.md, "One arithmetic"): the keys [first, pos] fall in chunks of ATT_CHUNK keys at
// absolute positions (chunk c: 128c .. 128c + 127); each chunk's state is its maximum score m,
// l = (g0 + g1) + (g2 + g3) of its four groups of 32 keys (g the warp butterfly of the group's
// e = exp(s − m)) and o = (a0 + a1) + (a2 + a3) (a the group's Σ e·v in key order), each score
// the dot product in element order times the scale; the chunks' states are merged by the
// pairwise tree in chunk order (att_merge; a tree of the next power of two of leaves, missing
// ones skipped); then the sink (gpt-oss) and the division. Head widths must be multiples of 32
// up to MAX_HEAD (checked at load).

// MAX_HEAD and ATT_CHUNK (keys per chunk: one per thread of a split block's four warps) come
// from src/program.rs.
// Keys per group and per key tile of the prefill kernel.
#define ATT_GROUP 32
// Levels of a tree's stack: up to 2^11 chunks (262,144 keys).
#define ATT_LEVELS 12

// A softmax state over some keys of one query row: maximum m, sum l (0: no key) and this
// thread's V unnormalized value columns.
template <int V>
struct AttState {
    float m, l;
    float o[V];
};

// The state of keys a then b (a earlier). Written once for both kernels.
template <int V>
__device__ __forceinline__ AttState<V> att_merge(const AttState<V>& a, const AttState<V>& b) {
    if (a.l == 0.0f) return b;
    if (b.l == 0.0f) return a;
    AttState<V> r;
    r.m = fmaxf(a.m, b.m);
    float alpha = expf(a.m - r.m), beta = expf(b.m - r.m);
    r.l = a.l * alpha + b.l * beta;
#pragma unroll
    for (int v = 0; v < V; ++v) r.o[v] = a.o[v] * alpha + b.o[v] * beta;
    return r;
}

// The pairwise tree over states pushed in order (a binary counter's stack): push merges each
// completed pair of subtrees; finish folds what is left, the latest first, which is the tree
// of the next power of two of leaves with the missing ones skipped.
template <int V>
struct AttTree {
    AttState<V> s[ATT_LEVELS];
    int level[ATT_LEVELS];
    int depth;
    __device__ __forceinline__ void init() { depth = 0; }
    __device__ __forceinline__ void push(AttState<V> leaf) {
        int lv = 0;
        while (depth > 0 && level[depth - 1] == lv) {
            leaf = att_merge(s[depth - 1], leaf);
            --depth;
            ++lv;
        }
        s[depth] = leaf;
        level[depth] = lv;
        ++depth;
    }
    __device__ __forceinline__ AttState<V> finish() const {
        AttState<V> r;
        r.m = -__int_as_float(0x7f800000);
        r.l = 0.0f;
#pragma unroll
        for (int v = 0; v < V; ++v) r.o[v] = 0.0f;
        if (depth == 0) return r;
        r = s[depth - 1];
        for (int i = depth - 2; i >= 0; --i) r = att_merge(s[i], r);
        return r;
    }
};

// The prefill kernel's sizes for heads of up to HEAD elements: WARPS warps of QPW rows each
// (shared memory and registers sized for the widest head would cost the common 64-wide heads
// occupancy); one tile of ATT_GROUP keys (or of their values) in shared memory at a time.
template <int HEAD_, int WARPS_, int QPW_>
struct AttSize {
    static const int HEAD = HEAD_, WARPS = WARPS_, QPW = QPW_;
    static const int THREADS = WARPS * 32, QUERIES = WARPS * QPW;
    // Value column pairs per lane, and value columns.
    static const int PAIRS = (HEAD + 63) / 64, V = 2 * PAIRS;
    // 16-byte units (8 f16) of a tile each thread fetches, at most.
    static const int UNITS = (ATT_GROUP * HEAD / 8 + THREADS - 1) / THREADS;
};
// The ATT_H*_WARPS and ATT_H*_QPW come from src/program.rs.
typedef AttSize<64, ATT_H64_WARPS, ATT_H64_QPW> AttHead64;
typedef AttSize<128, ATT_H128_WARPS, ATT_H128_QPW> AttHead128;
typedef AttSize<MAX_HEAD, ATT_H256_WARPS, ATT_H256_QPW> AttHead256;
static_assert(AttHead64::QUERIES <= 32 && AttHead128::QUERIES <= 32 && AttHead256::QUERIES <= 32,
              "a block's rows fit the 32-bit masks of attention_rows");

// Key j's row in a tile: float4 unit u (elements 4u..4u+3) stored at unit (u + j) mod units, so
// that the eight lanes of a quarter-warp reading unit u of keys j..j+7 hit distinct banks.
__device__ __forceinline__ int key_unit(int j, int u, int units) { return (u + j) % units; }

template <typename A>
struct AttTile {
    float q[A::QUERIES][A::HEAD];
    // One tile: keys as F4 units (swizzled by key_unit) or values as F2 pairs.
    float kv[ATT_GROUP * A::HEAD];
    int pos[A::QUERIES], first[A::QUERIES], table[A::QUERIES];
};

// A thread's share of a tile in registers (f16, as stored).
template <typename A>
struct AttStage {
    U4 u[A::UNITS];
};

// What a block reads: the layer's pool, the head's KV head, the widths.
struct AttKv {
    const u16* k_cache;
    const u16* v_cache;
    int kv_head, n_head_kv, dk, dv;
};

// This thread's units of the keys (values: `values`) base.. < base + ATT_GROUP of the sequence
// at `pages` that fall in [lo, hi] (the others are not read; no row uses them).
template <typename A>
__device__ __forceinline__ void att_fetch(AttStage<A>& st, const AttKv& kv, const int* pages,
                                          int base, int lo, int hi, bool values) {
    int width = values ? kv.dv : kv.dk, units = width / 8;
    const u16* cache = values ? kv.v_cache : kv.k_cache;
#pragma unroll
    for (int i = 0; i < A::UNITS; ++i) {
        int unit = threadIdx.x + i * blockDim.x;
        if (unit < ATT_GROUP * units) {
            int j = unit / units, p = base + j;
            if (p >= lo && p <= hi) {
                long long row = kv_row(pages, p) * kv.n_head_kv + kv.kv_head;
                st.u[i] = ((const U4*)(cache + row * width))[unit - j * units];
            }
        }
    }
}

// The eight f16 of a unit as two float4s.
__device__ __forceinline__ void widen(const U4& u, F4* lo, F4* hi) {
    *lo = F4{h2f((u16)(u.x & 0xffff)), h2f((u16)(u.x >> 16)), h2f((u16)(u.y & 0xffff)),
             h2f((u16)(u.y >> 16))};
    *hi = F4{h2f((u16)(u.z & 0xffff)), h2f((u16)(u.z >> 16)), h2f((u16)(u.w & 0xffff)),
             h2f((u16)(u.w >> 16))};
}

template <typename A>
__device__ __forceinline__ void att_store(AttTile<A>& sh, const AttStage<A>& st, const AttKv& kv,
                                          bool values) {
    int width = values ? kv.dv : kv.dk, units = width / 8, k4 = kv.dk / 4;
#pragma unroll
    for (int i = 0; i < A::UNITS; ++i) {
        int unit = threadIdx.x + i * blockDim.x;
        if (unit >= ATT_GROUP * units) continue;
        int j = unit / units, u = unit - j * units;
        F4 lo, hi;
        widen(st.u[i], &lo, &hi);
        if (values) {
            F4* row = (F4*)(sh.kv + j * A::HEAD);
            row[2 * u] = lo;
            row[2 * u + 1] = hi;
        } else {
            F4* row = (F4*)(sh.kv + j * A::HEAD);
            row[key_unit(j, 2 * u, k4)] = lo;
            row[key_unit(j, 2 * u + 1, k4)] = hi;
        }
    }
}

// The score of key `base + lane` (of the tile in shared memory) for row r: the dot product in
// element order times the scale, or -inf when the key is outside the row's range.
template <typename A>
__device__ __forceinline__ float att_score(const AttTile<A>& sh, int r, int base, int lane,
                                           int dk, float scale) {
    int p = base + lane;
    if (p < sh.first[r] || p > sh.pos[r]) return -__int_as_float(0x7f800000);
    int units = dk / 4, unit = key_unit(lane, 0, units);
    const F4* key = (const F4*)(sh.kv + lane * A::HEAD);
    float dot = 0.0f;
#pragma unroll 4
    for (int u = 0; u < units; ++u) {
        F4 k = key[unit];
        unit = unit + 1 == units ? 0 : unit + 1;
        F4 q = ld_f4(sh.q[r] + 4 * u);
        dot = fmaf(q.x, k.x, dot);
        dot = fmaf(q.y, k.y, dot);
        dot = fmaf(q.z, k.z, dot);
        dot = fmaf(q.w, k.w, dot);
    }
    return dot * scale;
}

// A head's sink (gpt-oss: a logit joining the softmax without a value) folded into a finished
// softmax of running maximum m and sum l: values are scaled by *keep and divided by *total,
// as ggml adds the sink after its keys. Without sinks, keep = 1 and total = l.
__device__ __forceinline__ void sink_weights(const float* sinks, int h, float m, float l,
                                             float* keep, float* total) {
    if (!sinks) {
        *keep = 1.0f;
        *total = l;
        return;
    }
    float s = sinks[h], m_new = fmaxf(m, s);
    *keep = expf(m - m_new);
    *total = l * *keep + expf(s - m_new);
}

// The final values of a row's state: sink (gpt-oss) folded in, divided by the total.
__device__ __forceinline__ float att_value(float o, float keep, float total) {
    return o * keep / total;
}

// Where a tile step of the prefill kernel is: chunk c's key tiles 0..3, then its value tiles.
struct AttStep {
    int chunk, tile;
    bool values;
};

__device__ __forceinline__ AttStep att_step(int c_lo, int step) {
    int per = 2 * (ATT_CHUNK / ATT_GROUP);
    return AttStep{c_lo + step / per, step % (per / 2), (step % per) >= per / 2};
}

// Whether rows r.. of the warp have a key in chunk c.
__device__ __forceinline__ bool att_row_in(int first, int pos, int c) {
    return first <= ATT_CHUNK * c + ATT_CHUNK - 1 && pos >= ATT_CHUNK * c;
}

// grid.x = heads, grid.y = tiles of A::QUERIES of the n rows. The tile's rows of one sequence
// share each key and value tile (chunk by chunk: its four key tiles, then its four value
// tiles), each warp computing its rows' chunk states in the order above; the next tile's loads
// are in flight while the current one is used.
template <typename A>
__device__ void attention_rows(const float* q, const u16* k_cache, const u16* v_cache,
                               const int* pos_of, const int* tables, const int* all_pages,
                               float* out, int n_head, int n_head_kv, int dk, int dv, float scale,
                               int window, const float* sinks, int n) {
    __shared__ __align__(16) AttTile<A> sh;
    const int Q = A::QPW, TILES = ATT_CHUNK / ATT_GROUP;
    int h = blockIdx.x, t0 = blockIdx.y * A::QUERIES;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int count = min(A::QUERIES, n - t0), r0 = warp * Q;
    AttKv kv = {k_cache, v_cache, h / (n_head / n_head_kv), n_head_kv, dk, dv};
    for (int i = threadIdx.x; i < A::QUERIES * dk; i += blockDim.x) {
        int r = i / dk, d = i - r * dk;
        sh.q[r][d] = r < count ? q[((long long)(t0 + r) * n_head + h) * dk + d] : 0.0f;
    }
    if (threadIdx.x < count) {
        int t = t0 + threadIdx.x, pos = pos_of[t];
        sh.pos[threadIdx.x] = pos;
        sh.first[threadIdx.x] = window > 0 ? max(0, pos + 1 - window) : 0;
        sh.table[threadIdx.x] = tables[t];
    }
    __syncthreads();
    AttTree<A::V> tree[Q];
#pragma unroll
    for (int i = 0; i < Q; ++i) tree[i].init();
    AttStage<A> st;
    // The tile's rows, one sequence (page table) at a time; the same in every thread.
    unsigned done = 0;
    for (int leader = 0; leader < count; ++leader) {
        if ((done >> leader) & 1) continue;
        int table = sh.table[leader], lo = sh.first[leader], hi = sh.pos[leader];
        unsigned group = 0;
        for (int r = leader; r < count; ++r) {
            if (sh.table[r] != table) continue;
            group |= 1u << r;
            lo = min(lo, sh.first[r]);
            hi = max(hi, sh.pos[r]);
        }
        done |= group;
        const int* pages = all_pages + table;
        int c_lo = lo / ATT_CHUNK, steps = (hi / ATT_CHUNK - c_lo + 1) * 2 * TILES;
        bool mine[Q];
        float e[Q][TILES];
        float o01[Q][A::V], o23[Q][A::V], mx[Q], l[Q];
        AttStep next = att_step(c_lo, 0);
        att_fetch(st, kv, pages, ATT_CHUNK * next.chunk + ATT_GROUP * next.tile, lo, hi, next.values);
        for (int step = 0; step < steps; ++step) {
            AttStep at = att_step(c_lo, step);
            int base = ATT_CHUNK * at.chunk + ATT_GROUP * at.tile;
            __syncthreads();  // the previous tile's readers are done
            att_store(sh, st, kv, at.values);
            __syncthreads();
            if (step + 1 < steps) {
                next = att_step(c_lo, step + 1);
                att_fetch(st, kv, pages, ATT_CHUNK * next.chunk + ATT_GROUP * next.tile, lo, hi,
                          next.values);
            }
#pragma unroll
            for (int i = 0; i < Q; ++i) {
                int r = r0 + i;
                bool row = r < count && ((group >> r) & 1);
                if (at.tile == 0 && !at.values)
                    mine[i] = row && att_row_in(sh.first[r], sh.pos[r], at.chunk);
                if (!mine[i]) continue;
                if (!at.values) {
                    // Key tile: this lane's key's score, kept until the chunk's maximum is known.
                    float s = att_score(sh, r, base, lane, dk, scale);
#pragma unroll
                    for (int t = 0; t < TILES; ++t)
                        if (t == at.tile) e[i][t] = s;
                    if (at.tile == TILES - 1) {
                        float m = fmaxf(fmaxf(e[i][0], e[i][1]), fmaxf(e[i][2], e[i][3]));
                        mx[i] = warp_max(m);
                        float g[TILES];
#pragma unroll
                        for (int t = 0; t < TILES; ++t) {
                            e[i][t] = e[i][t] == -__int_as_float(0x7f800000)
                                          ? 0.0f
                                          : expf(e[i][t] - mx[i]);
                            g[t] = warp_sum(e[i][t]);
                        }
                        l[i] = (g[0] + g[1]) + (g[2] + g[3]);
                    }
                    continue;
                }
                // Value tile: the group's Σ e·v in key order, then the chunk's tree of groups.
                float a[A::V];
#pragma unroll
                for (int v = 0; v < A::V; ++v) a[v] = 0.0f;
                float et = 0.0f;
#pragma unroll
                for (int t = 0; t < TILES; ++t)
                    if (t == at.tile) et = e[i][t];
                int j_lo = max(sh.first[r] - base, 0), j_hi = min(sh.pos[r] - base, ATT_GROUP - 1);
                for (int j = 0; j < ATT_GROUP; ++j) {
                    float ej = __shfl_sync(0xffffffffu, et, j);
                    if (j < j_lo || j > j_hi) continue;
                    const F2* vrow = (const F2*)(sh.kv + j * A::HEAD);
#pragma unroll
                    for (int c = 0; c < A::PAIRS; ++c) {
                        F2 v = lane + 32 * c < dv / 2 ? vrow[lane + 32 * c] : F2{0.0f, 0.0f};
                        a[2 * c] = fmaf(ej, v.x, a[2 * c]);
                        a[2 * c + 1] = fmaf(ej, v.y, a[2 * c + 1]);
                    }
                }
#pragma unroll
                for (int v = 0; v < A::V; ++v) {
                    if (at.tile == 0) o01[i][v] = a[v];
                    if (at.tile == 1) o01[i][v] = o01[i][v] + a[v];
                    if (at.tile == 2) o23[i][v] = a[v];
                    if (at.tile == 3) o23[i][v] = o23[i][v] + a[v];
                }
                if (at.tile == TILES - 1) {
                    AttState<A::V> leaf;
                    leaf.m = mx[i];
                    leaf.l = l[i];
#pragma unroll
                    for (int v = 0; v < A::V; ++v) leaf.o[v] = o01[i][v] + o23[i][v];
                    tree[i].push(leaf);
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < Q; ++i) {
        int r = r0 + i;
        if (r >= count) continue;
        AttState<A::V> final_state = tree[i].finish();
        float* dst = out + ((long long)(t0 + r) * n_head + h) * dv;
        float keep, total;
        sink_weights(sinks, h, final_state.m, final_state.l, &keep, &total);
#pragma unroll
        for (int c = 0; c < A::PAIRS; ++c) {
            int pair = lane + 32 * c;
            if (pair < dv / 2) {
                dst[2 * pair] = att_value(final_state.o[2 * c], keep, total);
                dst[2 * pair + 1] = att_value(final_state.o[2 * c + 1], keep, total);
            }
        }
    }
}

#define ATTENTION_KERNEL(NAME, SIZE)                                                               \
    extern "C" __global__ void __launch_bounds__(SIZE::THREADS) NAME(                              \
        const __grid_constant__ AttentionParams p) {                                               \
        attention_rows<SIZE>(p.q, p.k_cache, p.v_cache, p.rows.pos, p.rows.tables, p.rows.pages,   \
                             p.out, p.n_head, p.n_head_kv, p.dk, p.dv, p.scale, p.window, p.sinks, \
                             p.n);                                                                 \
    }

ATTENTION_KERNEL(attention_h64, AttHead64)
ATTENTION_KERNEL(attention_h128, AttHead128)
ATTENTION_KERNEL(attention_h256, AttHead256)

// Value column pairs (f16x2) per lane of the split kernel.
#define PAIRS_PER_LANE (MAX_HEAD / 64)
// Value columns a thread of the split kernel holds (MAX_HEAD over its 128 threads).
#define SPLIT_COLUMNS (MAX_HEAD / ATT_CHUNK)
#define SPLIT_WARPS (ATT_CHUNK / 32)

// The smallest power of two at least n (n ≥ 1).
__device__ __forceinline__ int pow2_at_least(int n) { return n <= 1 ? 1 : 1 << (32 - __clz(n - 1)); }

// Decode attention (a few queries over a long cache), split over the keys as flash-decoding
// does, because one block per head leaves most of the GPU idle: grid.x = n_head · splits,
// grid.y = queries, a thread per key of a chunk. A row of N chunks has a tree
// of N' = pow2_at_least(N) leaves: from N' ≥ splits on, block s takes the aligned subtree of
// leaves s·N'/splits..; below, block s takes leaf s. Each block computes its leaves' chunk states
// in the order above and their subtree; the last block to finish (an atomic count per query
// and head, after a __threadfence) adds the blocks' subtrees by the tree's top levels and
// resets the count for the next replay, so no second launch is needed. With one block of
// leaves the block writes the result itself. The grid is sized for the longest row of the pass
// (positions are only known on the device); blocks without leaves return at once.
extern "C" __global__ void __launch_bounds__(ATT_CHUNK)
attention_split(const __grid_constant__ AttentionParams args) {
    const float* q = args.q;
    const u16 *k_cache = args.k_cache, *v_cache = args.v_cache;
    const int *pos_of = args.rows.pos, *tables = args.rows.tables, *all_pages = args.rows.pages;
    float* out = args.out;
    int n_head = args.n_head, n_head_kv = args.n_head_kv, dk = args.dk, dv = args.dv;
    float scale = args.scale;
    int window = args.window, splits = args.splits;
    const float* sinks = args.sinks;
    float* partial = args.partial;
    u32* counters = args.counters;
    __shared__ float s_q[MAX_HEAD];
    __shared__ float s_e[ATT_CHUNK];
    __shared__ long long s_row[ATT_CHUNK];
    __shared__ float s_max[SPLIT_WARPS], s_sum[SPLIT_WARPS];
    __shared__ float s_acc[SPLIT_WARPS][MAX_HEAD];
    __shared__ int s_last;
    int h = blockIdx.x / splits, split = blockIdx.x - h * splits, t = blockIdx.y;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int pos = pos_of[t];
    const int* pages = all_pages + tables[t];
    int first = window > 0 ? max(0, pos + 1 - window) : 0;
    int c0 = first / ATT_CHUNK, leaves = pos / ATT_CHUNK - c0 + 1;
    // Blocks past the largest power of two in `splits` take no leaves (the host sends powers
    // of two; any count gives the same bits).
    int blocks = 1 << (31 - __clz(splits)), padded = pow2_at_least(leaves);
    int per = padded >= blocks ? padded / blocks : 1;
    int lo_leaf = split * per, hi_leaf = min(leaves, lo_leaf + per);
    int active = (leaves + per - 1) / per;
    if (split >= blocks || lo_leaf >= hi_leaf) return;
    int kv_head = h / (n_head / n_head_kv);
    int k_width = n_head_kv * dk, v_width = n_head_kv * dv, pairs = dv / 2;
    const float* query = q + ((long long)t * n_head + h) * dk;
    for (int j = threadIdx.x; j < dk; j += blockDim.x) s_q[j] = query[j];
    __syncthreads();
    AttTree<SPLIT_COLUMNS> tree;
    tree.init();
    for (int leaf = lo_leaf; leaf < hi_leaf; ++leaf) {
        int base = ATT_CHUNK * (c0 + leaf), p = base + threadIdx.x;
        bool valid = p >= first && p <= pos;
        float s = -__int_as_float(0x7f800000);
        // Each thread looks up its key's row once (keys outside the range read the nearest
        // valid one, with weight 0); the value loop reads them from shared memory.
        long long my_row = kv_row(pages, min(max(p, first), pos));
        s_row[threadIdx.x] = my_row;
        if (valid) {
            const U4* key = (const U4*)(k_cache + my_row * k_width + kv_head * dk);
            float dot = 0.0f;
#pragma unroll 8
            for (int i = 0; i < dk / 8; ++i) {
                U4 raw = key[i];
                u32 words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
                for (int w = 0; w < 4; ++w) {
                    dot = fmaf(s_q[8 * i + 2 * w], h2f((u16)(words[w] & 0xffff)), dot);
                    dot = fmaf(s_q[8 * i + 2 * w + 1], h2f((u16)(words[w] >> 16)), dot);
                }
            }
            s = dot * scale;
        }
        float wm = warp_max(s);
        if (lane == 0) s_max[warp] = wm;
        __syncthreads();
        // The chunk holds at least one of the row's keys, so its maximum is finite.
        float m = fmaxf(fmaxf(s_max[0], s_max[1]), fmaxf(s_max[2], s_max[3]));
        float e = valid ? expf(s - m) : 0.0f;
        s_e[threadIdx.x] = e;
        float ws = warp_sum(e);
        if (lane == 0) s_sum[warp] = ws;
        __syncthreads();
        float l = (s_sum[0] + s_sum[1]) + (s_sum[2] + s_sum[3]);
        // Warp w: its group's keys 32w.. in order, eight rows' loads in flight.
        float acc[2 * PAIRS_PER_LANE];
#pragma unroll
        for (int i = 0; i < 2 * PAIRS_PER_LANE; ++i) acc[i] = 0.0f;
        const u32* value = (const u32*)(v_cache + kv_head * dv);
#pragma unroll
        for (int j0 = 0; j0 < 32; j0 += 8) {
#pragma unroll
            for (int u = 0; u < 8; ++u) {
                int j = 32 * warp + j0 + u;
                float ej = s_e[j];
                const u32* row = value + s_row[j] * (v_width / 2);
#pragma unroll
                for (int i = 0; i < PAIRS_PER_LANE; ++i) {
                    int col = lane + 32 * i;
                    if (col < pairs) {
                        u32 two = row[col];
                        acc[2 * i] = fmaf(ej, h2f((u16)(two & 0xffff)), acc[2 * i]);
                        acc[2 * i + 1] = fmaf(ej, h2f((u16)(two >> 16)), acc[2 * i + 1]);
                    }
                }
            }
        }
#pragma unroll
        for (int i = 0; i < PAIRS_PER_LANE; ++i) {
            int col = lane + 32 * i;
            if (col < pairs) {
                s_acc[warp][2 * col] = acc[2 * i];
                s_acc[warp][2 * col + 1] = acc[2 * i + 1];
            }
        }
        __syncthreads();
        AttState<SPLIT_COLUMNS> state;
        state.m = m;
        state.l = l;
#pragma unroll
        for (int c = 0; c < SPLIT_COLUMNS; ++c) {
            int j = threadIdx.x + ATT_CHUNK * c;
            state.o[c] = j < dv ? (s_acc[0][j] + s_acc[1][j]) + (s_acc[2][j] + s_acc[3][j]) : 0.0f;
        }
        tree.push(state);
        __syncthreads();  // s_e, s_row and s_acc are reused by the next chunk
    }
    AttState<SPLIT_COLUMNS> mine = tree.finish();
    long long head = (long long)t * n_head + h;
    float* dst = out + head * dv;
    if (active == 1) {
        float keep, total;
        sink_weights(sinks, h, mine.m, mine.l, &keep, &total);
#pragma unroll
        for (int c = 0; c < SPLIT_COLUMNS; ++c) {
            int j = threadIdx.x + ATT_CHUNK * c;
            if (j < dv) dst[j] = att_value(mine.o[c], keep, total);
        }
        return;
    }
    float* slot = partial + (head * splits + split) * (dv + 2);
#pragma unroll
    for (int c = 0; c < SPLIT_COLUMNS; ++c) {
        int j = threadIdx.x + ATT_CHUNK * c;
        if (j < dv) slot[2 + j] = mine.o[c];
    }
    if (threadIdx.x == 0) {
        slot[0] = mine.m;
        slot[1] = mine.l;
    }
    // The partial result must be visible to the block that merges before it is counted.
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        u32 done = atomicAdd(counters + head, 1u);
        s_last = done == (u32)(active - 1);
        if (s_last) counters[head] = 0;
    }
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    // The blocks' subtrees, in block order, by the tree's top levels.
    const float* parts = partial + head * splits * (dv + 2);
    AttTree<SPLIT_COLUMNS> top;
    top.init();
    for (int b = 0; b < active; ++b) {
        const float* part = parts + b * (dv + 2);
        AttState<SPLIT_COLUMNS> state;
        state.m = __ldcg(part);
        state.l = __ldcg(part + 1);
#pragma unroll
        for (int c = 0; c < SPLIT_COLUMNS; ++c) {
            int j = threadIdx.x + ATT_CHUNK * c;
            state.o[c] = j < dv ? __ldcg(part + 2 + j) : 0.0f;
        }
        top.push(state);
    }
    AttState<SPLIT_COLUMNS> all = top.finish();
    float keep, total;
    sink_weights(sinks, h, all.m, all.l, &keep, &total);
#pragma unroll
    for (int c = 0; c < SPLIT_COLUMNS; ++c) {
        int j = threadIdx.x + ATT_CHUNK * c;
        if (j < dv) dst[j] = att_value(all.o[c], keep, total);
    }
}
