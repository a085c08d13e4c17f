// Causal (optionally sliding-window) attention of grid.y query rows over one layer of the f16
// KV pool: row t at its position over its own sequence's keys (StepRows: a pass may hold
// rows of many sequences). One block per (head, query): its warps take chunks of 32 keys in turn,
// each keeping an online softmax (running max, sum, weighted values), merged at the end. In a
// chunk each lane scores one key on its own (no reduction between lanes), then the warp adds up
// the 32 value rows, lanes on head elements lane, lane + 32, …; so head widths must be
// multiples of 32 up to MAX_HEAD (checked at load).

#define ATT_WARPS 16
#define MAX_HEAD 256
#define PER_LANE (MAX_HEAD / 32)

extern "C" __global__ void __launch_bounds__(ATT_WARPS * 32)
attention(const float* q, const u16* k_cache, const u16* v_cache, const int* pos_of,
          const int* tables, const int* all_pages, float* out, int n_head, int n_head_kv, int dk,
          int dv, float scale, int window) {
    __shared__ float s_max[ATT_WARPS], s_sum[ATT_WARPS];
    __shared__ float s_acc[ATT_WARPS][MAX_HEAD];
    __shared__ float s_q[MAX_HEAD];
    int h = blockIdx.x, t = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int pos = pos_of[t];
    const int* pages = all_pages + tables[t];
    int first = window > 0 ? max(0, pos + 1 - window) : 0;
    int kv_head = h / (n_head / n_head_kv);
    int k_width = n_head_kv * dk, v_width = n_head_kv * dv;
    int nv = dv / 32;
    const float* query = q + ((long long)t * n_head + h) * dk;
    for (int j = threadIdx.x; j < dk; j += blockDim.x) s_q[j] = query[j];
    __syncthreads();
    float acc[PER_LANE];
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) acc[i] = 0.0f;
    float m = -__int_as_float(0x7f800000), l = 0.0f;  // -inf
    for (int base = first + 32 * warp; base <= pos; base += 32 * ATT_WARPS) {
        int p = base + lane;
        float s = -__int_as_float(0x7f800000);
        // Each lane looks up its key's row; the value loop below takes them by shuffle.
        long long my_row = p <= pos ? kv_row(pages, p) : 0;
        if (p <= pos) {
            // Eight f16 keys per 16-byte load; rows start at multiples of 32 elements.
            const U4* key = (const U4*)(k_cache + my_row * k_width + kv_head * dk);
            float dot = 0.0f;
#pragma unroll 4
            for (int c = 0; c < dk / 8; ++c) {
                U4 raw = key[c];
                u32 words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
                for (int w = 0; w < 4; ++w) {
                    dot = fmaf(s_q[8 * c + 2 * w], h2f((u16)(words[w] & 0xffff)), dot);
                    dot = fmaf(s_q[8 * c + 2 * w + 1], h2f((u16)(words[w] >> 16)), dot);
                }
            }
            s = dot * scale;
        }
        // Lane 0's key (base ≤ pos) is always valid, so the chunk's maximum is finite.
        float m_new = fmaxf(m, warp_max(s));
        float correction = expf(m - m_new), e = expf(s - m_new);
        l = l * correction + warp_sum(e);
#pragma unroll
        for (int i = 0; i < PER_LANE; ++i) acc[i] *= correction;
        int count = min(32, pos - base + 1);
        const u16* value = v_cache + kv_head * dv;
        // Eight value rows at a time, so their loads are in flight together.
        for (int j0 = 0; j0 < count; j0 += 8) {
#pragma unroll
            for (int u = 0; u < 8; ++u) {
                int j = j0 + u;
                float ej = __shfl_sync(0xffffffffu, e, j & 31);
                long long rj = __shfl_sync(0xffffffffu, my_row, j & 31);
                if (j < count) {
                    const u16* row = value + rj * v_width;
#pragma unroll
                    for (int i = 0; i < PER_LANE; ++i)
                        if (i < nv) acc[i] = fmaf(ej, h2f(row[lane + 32 * i]), acc[i]);
                }
            }
        }
        m = m_new;
    }
    if (lane == 0) {
        s_max[warp] = m;
        s_sum[warp] = l;
    }
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i)
        if (i < nv) s_acc[warp][lane + 32 * i] = acc[i];
    __syncthreads();
    // Warp 0 always saw key `first`, so the overall maximum is finite.
    float total_max = s_max[0];
    for (int w = 1; w < ATT_WARPS; ++w) total_max = fmaxf(total_max, s_max[w]);
    float weights[ATT_WARPS], total = 0.0f;
#pragma unroll
    for (int w = 0; w < ATT_WARPS; ++w) {
        weights[w] = expf(s_max[w] - total_max);
        total += s_sum[w] * weights[w];
    }
    float* dst = out + ((long long)t * n_head + h) * dv;
    for (int j = threadIdx.x; j < dv; j += blockDim.x) {
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; ++w) v = fmaf(s_acc[w][j], weights[w], v);
        dst[j] = v / total;
    }
}

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
// Value column pairs (f16x2) per lane.
#define PAIRS_PER_LANE (MAX_HEAD / 64)

extern "C" __global__ void __launch_bounds__(SPLIT_CHUNK)
attention_split(const float* q, const u16* k_cache, const u16* v_cache, const int* pos_of,
                const int* tables, const int* all_pages, float* out, int n_head, int n_head_kv,
                int dk, int dv, float scale, int window, int splits, float* partial,
                u32* counters) {
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
        for (int j = threadIdx.x; j < dv; j += blockDim.x)
            dst[j] = ((s_acc[0][j] + s_acc[1][j]) + (s_acc[2][j] + s_acc[3][j])) / l;
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
        float total = warp_sum(l_s * weight);
        s_weight[lane] = weight;
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
