// Causal (optionally sliding-window) attention of the query rows of a pass of long chunks over
// one layer of the f16 KV pool: row t at its position over its own sequence's keys (StepRows:
// a pass may hold rows of many sequences). A block takes one head and a tile of consecutive
// rows; the tile's rows of one sequence share each tile of KEYS keys (from position 0 in steps
// of KEYS), loaded once into shared memory as f32 (the next tile's loads in flight while the
// current one is used), and each warp runs the online softmax of its QPW rows over them,
// reading each key and value row once for all of them. Per row the arithmetic is fixed by its
// position alone: its key tiles in order, in each one lane per key scoring the whole dot
// product (keys outside the row's window or past its position skipped), the row's maximum and
// sum over the warp, then the value rows of its keys added one after another, lanes on pairs
// of head elements. So a row's result does not depend on the other rows of its tile or pass,
// nor on how its prompt was cut into chunks. Head widths must be multiples of 32 up to MAX_HEAD
// (checked at load).

#define MAX_HEAD 256

// The prefill kernel's sizes for heads of up to HEAD elements: KEYS keys per tile, WARPS warps
// of QPW rows each (shared memory and registers sized for the widest head would cost the
// common 64-wide heads occupancy). One row per warp where the tiles fit: a warp's rows take
// their key tiles one after another, so the rows, not the tiles, are the parallelism (four per
// warp ran a 512-token prompt's attention 1.4× slower than two).
template <int HEAD_, int KEYS_, int WARPS_, int QPW_>
struct AttSize {
    static const int HEAD = HEAD_, KEYS = KEYS_, WARPS = WARPS_, QPW = QPW_;
    static const int THREADS = WARPS * 32, QUERIES = WARPS * QPW;
    // Value column pairs per lane.
    static const int PAIRS = (HEAD + 63) / 64;
    // 16-byte units (8 f16) of a key tile, and of a value tile, each thread fetches, at most.
    static const int UNITS = (KEYS * HEAD / 8 + THREADS - 1) / THREADS;
};
typedef AttSize<64, 32, 16, 1> AttHead64;
typedef AttSize<128, 32, 16, 1> AttHead128;
typedef AttSize<MAX_HEAD, 16, 4, 2> AttHead256;

// Key j's row in a tile: float4 unit u (elements 4u..4u+3) stored at unit (u + j) mod units, so
// that the eight lanes of a quarter-warp reading unit u of keys j..j+7 hit distinct banks.
__device__ __forceinline__ int key_unit(int j, int u, int units) { return (u + j) % units; }

template <typename A>
struct AttTile {
    float q[A::QUERIES][A::HEAD];
    F4 k[A::KEYS][A::HEAD / 4];
    F2 v[A::KEYS][A::HEAD / 2];
    int pos[A::QUERIES], first[A::QUERIES], table[A::QUERIES];
};

// A thread's share of a key tile in registers: units threadIdx.x, + blockDim.x, … of the keys
// and of the values, as stored (f16).
template <typename A>
struct AttStage {
    U4 k[A::UNITS], v[A::UNITS];
};

// What a block reads: the layer's pool, the head's KV head, the widths.
struct AttKv {
    const u16* k_cache;
    const u16* v_cache;
    int kv_head, n_head_kv, dk, dv;
};

// This thread's units of keys base.. < base + KEYS of the sequence at `pages` that fall in
// [lo, hi] (the others are not read; no row uses them).
template <typename A>
__device__ __forceinline__ void att_fetch(AttStage<A>& st, const AttKv& kv, const int* pages,
                                          int base, int lo, int hi) {
    int k_units = kv.dk / 8, v_units = kv.dv / 8;
#pragma unroll
    for (int i = 0; i < A::UNITS; ++i) {
        int unit = threadIdx.x + i * blockDim.x;
        if (unit < A::KEYS * k_units) {
            int j = unit / k_units, p = base + j;
            if (p >= lo && p <= hi) {
                long long row = kv_row(pages, p) * kv.n_head_kv + kv.kv_head;
                st.k[i] = ((const U4*)(kv.k_cache + row * kv.dk))[unit - j * k_units];
            }
        }
        if (unit < A::KEYS * v_units) {
            int j = unit / v_units, p = base + j;
            if (p >= lo && p <= hi) {
                long long row = kv_row(pages, p) * kv.n_head_kv + kv.kv_head;
                st.v[i] = ((const U4*)(kv.v_cache + row * kv.dv))[unit - j * v_units];
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
__device__ __forceinline__ void att_store(AttTile<A>& sh, const AttStage<A>& st,
                                          const AttKv& kv) {
    int k_units = kv.dk / 8, v_units = kv.dv / 8, k4 = kv.dk / 4;
#pragma unroll
    for (int i = 0; i < A::UNITS; ++i) {
        int unit = threadIdx.x + i * blockDim.x;
        F4 lo, hi;
        if (unit < A::KEYS * k_units) {
            int j = unit / k_units, u = unit - j * k_units;
            widen(st.k[i], &lo, &hi);
            sh.k[j][key_unit(j, 2 * u, k4)] = lo;
            sh.k[j][key_unit(j, 2 * u + 1, k4)] = hi;
        }
        if (unit < A::KEYS * v_units) {
            int j = unit / v_units, u = unit - j * v_units;
            widen(st.v[i], &lo, &hi);
            F4* row = (F4*)sh.v[j];
            row[2 * u] = lo;
            row[2 * u + 1] = hi;
        }
    }
}

// One online-softmax state per row of a warp: running maximum, sum and weighted value pairs.
template <typename A>
struct AttRows {
    float m[A::QPW], l[A::QPW];
    F2 acc[A::QPW][A::PAIRS];
};

// The warp's rows r0.. (those `active` in this tile) over the keys base.. of the tile: each
// key row read once for all of them, each row's arithmetic its own.
template <typename A>
__device__ __forceinline__ void att_rows_tile(const AttTile<A>& sh, int r0, const bool* active,
                                              int base, int lane, int dk, int dv, float scale,
                                              AttRows<A>& st) {
    const int Q = A::QPW;
    int p = base + lane;
    bool valid[Q];
    float dot[Q];
#pragma unroll
    for (int i = 0; i < Q; ++i) {
        valid[i] = active[i] && lane < A::KEYS && p >= sh.first[r0 + i] && p <= sh.pos[r0 + i];
        dot[i] = 0.0f;
    }
    int units = dk / 4, unit = key_unit(lane, 0, units);
    const F4* key = sh.k[lane % A::KEYS];
#pragma unroll 4
    for (int u = 0; u < units; ++u) {
        F4 k = key[unit];
        unit = unit + 1 == units ? 0 : unit + 1;
#pragma unroll
        for (int i = 0; i < Q; ++i) {
            if (!valid[i]) continue;
            F4 q = ld_f4(sh.q[r0 + i] + 4 * u);
            dot[i] = fmaf(q.x, k.x, dot[i]);
            dot[i] = fmaf(q.y, k.y, dot[i]);
            dot[i] = fmaf(q.z, k.z, dot[i]);
            dot[i] = fmaf(q.w, k.w, dot[i]);
        }
    }
    float e[Q];
    int j_lo = A::KEYS, j_hi = -1;
#pragma unroll
    for (int i = 0; i < Q; ++i) {
        if (!active[i]) continue;
        float s = valid[i] ? dot[i] * scale : -__int_as_float(0x7f800000);
        // The tile holds at least one of the row's keys, so the maximum is finite.
        float m_new = fmaxf(st.m[i], warp_max(s));
        float correction = expf(st.m[i] - m_new);
        e[i] = expf(s - m_new);
        st.l[i] = st.l[i] * correction + warp_sum(e[i]);
#pragma unroll
        for (int c = 0; c < A::PAIRS; ++c) {
            st.acc[i][c].x *= correction;
            st.acc[i][c].y *= correction;
        }
        st.m[i] = m_new;
        j_lo = min(j_lo, max(sh.first[r0 + i] - base, 0));
        j_hi = max(j_hi, min(sh.pos[r0 + i] - base, A::KEYS - 1));
    }
    int pairs = dv / 2;
    for (int j = j_lo; j <= j_hi; ++j) {
        F2 v[A::PAIRS];
#pragma unroll
        for (int c = 0; c < A::PAIRS; ++c)
            v[c] = lane + 32 * c < pairs ? sh.v[j][lane + 32 * c] : F2{0.0f, 0.0f};
#pragma unroll
        for (int i = 0; i < Q; ++i) {
            if (!active[i]) continue;
            float ej = __shfl_sync(0xffffffffu, e[i], j);
            if (base + j < sh.first[r0 + i] || base + j > sh.pos[r0 + i]) continue;
#pragma unroll
            for (int c = 0; c < A::PAIRS; ++c) {
                st.acc[i][c].x = fmaf(ej, v[c].x, st.acc[i][c].x);
                st.acc[i][c].y = fmaf(ej, v[c].y, st.acc[i][c].y);
            }
        }
    }
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

// grid.x = heads, grid.y = tiles of A::QUERIES of the n rows.
template <typename A>
__device__ void attention_rows(const float* q, const u16* k_cache, const u16* v_cache,
                               const int* pos_of, const int* tables, const int* all_pages,
                               float* out, int n_head, int n_head_kv, int dk, int dv, float scale,
                               int window, const float* sinks, int n) {
    __shared__ __align__(16) AttTile<A> sh;
    int h = blockIdx.x, t0 = blockIdx.y * A::QUERIES;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int count = min(A::QUERIES, n - t0), r0 = warp * A::QPW;
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
    AttRows<A> rows;
#pragma unroll
    for (int i = 0; i < A::QPW; ++i) {
        rows.m[i] = -__int_as_float(0x7f800000);
        rows.l[i] = 0.0f;
#pragma unroll
        for (int c = 0; c < A::PAIRS; ++c) rows.acc[i][c] = F2{0.0f, 0.0f};
    }
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
        int first_base = lo - lo % A::KEYS;
        att_fetch(st, kv, pages, first_base, lo, hi);
        for (int base = first_base; base <= hi; base += A::KEYS) {
            __syncthreads();  // the previous tile's readers are done
            att_store(sh, st, kv);
            __syncthreads();
            if (base + A::KEYS <= hi) att_fetch(st, kv, pages, base + A::KEYS, lo, hi);
            bool active[A::QPW];
            bool any = false;
#pragma unroll
            for (int i = 0; i < A::QPW; ++i) {
                int r = r0 + i;
                active[i] = r < count && ((group >> r) & 1) && base <= sh.pos[r] &&
                            base + A::KEYS > sh.first[r];
                any = any || active[i];
            }
            if (any) att_rows_tile(sh, r0, active, base, lane, dk, dv, scale, rows);
        }
    }
#pragma unroll
    for (int i = 0; i < A::QPW; ++i) {
        int r = r0 + i;
        if (r >= count) continue;
        float* dst = out + ((long long)(t0 + r) * n_head + h) * dv;
        float keep, total;
        sink_weights(sinks, h, rows.m[i], rows.l[i], &keep, &total);
#pragma unroll
        for (int c = 0; c < A::PAIRS; ++c) {
            int pair = lane + 32 * c;
            if (pair < dv / 2) {
                dst[2 * pair] = rows.acc[i][c].x * keep / total;
                dst[2 * pair + 1] = rows.acc[i][c].y * keep / total;
            }
        }
    }
}

#define ATTENTION_KERNEL(NAME, SIZE)                                                               \
    extern "C" __global__ void __launch_bounds__(SIZE::THREADS) NAME(                              \
        const float* q, const u16* k_cache, const u16* v_cache, const int* pos_of,                 \
        const int* tables, const int* all_pages, float* out, int n_head, int n_head_kv, int dk,    \
        int dv, float scale, int window, const float* sinks, int n) {                              \
        attention_rows<SIZE>(q, k_cache, v_cache, pos_of, tables, all_pages, out, n_head,          \
                             n_head_kv, dk, dv, scale, window, sinks, n);                          \
    }

ATTENTION_KERNEL(attention_h64, AttHead64)
ATTENTION_KERNEL(attention_h128, AttHead128)
ATTENTION_KERNEL(attention_h256, AttHead256)

// Value column pairs (f16x2) per lane of the split decode kernel.
#define PAIRS_PER_LANE (MAX_HEAD / 64)

// Decode attention (a few queries over a long cache), split over the keys as flash-decoding
// does, because one block per head leaves most of the GPU idle: grid.x = n_head · splits,
// grid.y = queries. The keys from the window start on are cut into chunks of SPLIT_CHUNK; block
// s of a head takes chunks s, s + splits, … with one online softmax for the whole block (one
// lane per key for the scores, then each warp adds up a quarter of the chunk's value rows).
// Every block writes its partial result (max, sum, unnormalized values); the last one to finish,
// counted per query and head with an atomic, merges them and resets its count for the next
// replay, so no second launch is needed. The grid is sized for the longest sequence while the
// position is only known on the device, so blocks past the last chunk return at once.

#define SPLIT_WARPS 4
#define SPLIT_CHUNK (SPLIT_WARPS * 32)

extern "C" __global__ void __launch_bounds__(SPLIT_CHUNK)
attention_split(const float* q, const u16* k_cache, const u16* v_cache, const int* pos_of,
                const int* tables, const int* all_pages, float* out, int n_head, int n_head_kv,
                int dk, int dv, float scale, int window, const float* sinks, int splits,
                float* partial, u32* counters) {
    __shared__ float s_q[MAX_HEAD];
    __shared__ float s_e[SPLIT_CHUNK];
    __shared__ long long s_row[SPLIT_CHUNK];
    __shared__ float s_max[SPLIT_WARPS], s_sum[SPLIT_WARPS];
    __shared__ float s_acc[SPLIT_WARPS][MAX_HEAD];
    __shared__ int s_last;
    int h = blockIdx.x / splits, split = blockIdx.x - h * splits, t = blockIdx.y;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int pos = pos_of[t];
    const int* pages = all_pages + tables[t];
    int first = window > 0 ? max(0, pos + 1 - window) : 0;
    int chunks = (pos - first) / SPLIT_CHUNK + 1;
    int active = min(splits, chunks);
    if (split >= active) return;
    int kv_head = h / (n_head / n_head_kv);
    int k_width = n_head_kv * dk, v_width = n_head_kv * dv, pairs = dv / 2;
    const float* query = q + ((long long)t * n_head + h) * dk;
    for (int j = threadIdx.x; j < dk; j += blockDim.x) s_q[j] = query[j];
    __syncthreads();
    float acc[2 * PAIRS_PER_LANE];
#pragma unroll
    for (int i = 0; i < 2 * PAIRS_PER_LANE; ++i) acc[i] = 0.0f;
    float m = -__int_as_float(0x7f800000), l = 0.0f;  // -inf
    for (int c = split; c < chunks; c += splits) {
        int base = first + c * SPLIT_CHUNK, p = base + threadIdx.x;
        float s = -__int_as_float(0x7f800000);
        // Each thread looks up its key's row once; the value loop reads them from shared memory.
        long long my_row = p <= pos ? kv_row(pages, p) : 0;
        s_row[threadIdx.x] = my_row;
        if (p <= pos) {
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
        // Thread 0's key (base ≤ pos) is always valid, so the chunk's maximum is finite.
        float m_new = fmaxf(m, fmaxf(fmaxf(s_max[0], s_max[1]), fmaxf(s_max[2], s_max[3])));
        float correction = expf(m - m_new), e = expf(s - m_new);
        s_e[threadIdx.x] = e;
        float ws = warp_sum(e);
        if (lane == 0) s_sum[warp] = ws;
        __syncthreads();
        l = l * correction + ((s_sum[0] + s_sum[1]) + (s_sum[2] + s_sum[3]));
#pragma unroll
        for (int i = 0; i < 2 * PAIRS_PER_LANE; ++i) acc[i] *= correction;
        int count = min(SPLIT_CHUNK, pos - base + 1);
        const u32* value = (const u32*)(v_cache + kv_head * dv);
        // Eight rows at a time with no branch, so their loads are in flight together: rows
        // past the position are read at the last valid one and weigh e = 0.
#pragma unroll 4
        for (int j0 = warp; j0 < count; j0 += 8 * SPLIT_WARPS) {
#pragma unroll
            for (int u = 0; u < 8; ++u) {
                int j = j0 + u * SPLIT_WARPS;
                float ej = j < count ? s_e[j] : 0.0f;
                const u32* row = value + s_row[min(j, count - 1)] * (v_width / 2);
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
        m = m_new;
        __syncthreads();
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
    long long head = (long long)t * n_head + h;
    float* dst = out + head * dv;
    if (active == 1) {
        float keep, total;
        sink_weights(sinks, h, m, l, &keep, &total);
        for (int j = threadIdx.x; j < dv; j += blockDim.x)
            dst[j] = ((s_acc[0][j] + s_acc[1][j]) + (s_acc[2][j] + s_acc[3][j])) * keep / total;
        return;
    }
    float* mine = partial + (head * splits + split) * (dv + 2);
    for (int j = threadIdx.x; j < dv; j += blockDim.x)
        mine[2 + j] = (s_acc[0][j] + s_acc[1][j]) + (s_acc[2][j] + s_acc[3][j]);
    if (threadIdx.x == 0) {
        mine[0] = m;
        mine[1] = l;
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
    // The merge, in two round trips to L2: lane s of warp 0 reads split s's max and sum (at
    // most 32 splits) and weighs it, then each thread sums its value columns over the splits
    // with several loads in flight.
    __shared__ float s_weight[32];
    __shared__ float s_total;
    const float* parts = partial + head * splits * (dv + 2);
    if (warp == 0) {
        bool mine_valid = lane < active;
        float m_s = mine_valid ? __ldcg(parts + lane * (dv + 2)) : -__int_as_float(0x7f800000);
        float l_s = mine_valid ? __ldcg(parts + lane * (dv + 2) + 1) : 0.0f;
        float merged_max = warp_max(m_s);
        float weight = mine_valid ? expf(m_s - merged_max) : 0.0f;
        float keep, total;
        sink_weights(sinks, h, merged_max, warp_sum(l_s * weight), &keep, &total);
        s_weight[lane] = weight * keep;
        if (lane == 0) s_total = total;
    }
    __syncthreads();
    for (int j = threadIdx.x; j < dv; j += blockDim.x) {
        float v = 0.0f;
#pragma unroll 8
        for (int s = 0; s < active; ++s) v = fmaf(__ldcg(parts + s * (dv + 2) + 2 + j), s_weight[s], v);
        dst[j] = v / s_total;
    }
}
