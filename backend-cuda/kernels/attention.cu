// Causal (optionally sliding-window) attention of grid.y queries at positions *pos.. over the
// f16 KV cache of one layer (the position is read from device memory so that a captured decode
// step can be replayed). One block per (head, query): its warps take chunks of 32 keys in turn,
// each keeping an online softmax (running max, sum, weighted values), merged at the end. In a
// chunk each lane scores one key on its own (no reduction between lanes), then the warp adds up
// the 32 value rows, lanes on head elements lane, lane + 32, …; so head widths must be
// multiples of 32 up to MAX_HEAD (checked at load).

#define ATT_WARPS 16
#define MAX_HEAD 256
#define PER_LANE (MAX_HEAD / 32)

extern "C" __global__ void __launch_bounds__(ATT_WARPS * 32)
attention(const float* q, const u16* k_cache, const u16* v_cache, float* out, const int* start,
          int n_head, int n_head_kv, int dk, int dv, float scale, int window) {
    __shared__ float s_max[ATT_WARPS], s_sum[ATT_WARPS];
    __shared__ float s_acc[ATT_WARPS][MAX_HEAD];
    __shared__ float s_q[MAX_HEAD];
    int h = blockIdx.x, t = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int pos = *start + t;
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
        if (p <= pos) {
            // Eight f16 keys per 16-byte load; rows start at multiples of 32 elements.
            const U4* key = (const U4*)(k_cache + (long long)p * k_width + kv_head * dk);
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
        const u16* value = v_cache + (long long)base * v_width + kv_head * dv;
        // Eight value rows at a time, so their loads are in flight together.
        for (int j0 = 0; j0 < count; j0 += 8) {
#pragma unroll
            for (int u = 0; u < 8; ++u) {
                int j = j0 + u;
                float ej = __shfl_sync(0xffffffffu, e, j & 31);
                if (j < count) {
                    const u16* row = value + (long long)j * v_width;
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
