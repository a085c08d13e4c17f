// Causal (optionally sliding-window) attention of grid.y queries at positions start_pos.. over
// the f16 KV cache of one layer. One block per (head, query): its 8 warps split the key range
// (key p goes to warp p mod 8), each keeping an online softmax (running max, sum, weighted
// values), merged at the end. Lanes hold head elements lane, lane + 32, …, so head widths must be
// multiples of 32 up to MAX_HEAD (checked at load).

#define ATT_WARPS 8
#define MAX_HEAD 256
#define PER_LANE (MAX_HEAD / 32)

extern "C" __global__ void __launch_bounds__(ATT_WARPS * 32)
attention(const float* q, const u16* k_cache, const u16* v_cache, float* out, int start_pos,
          int n_head, int n_head_kv, int dk, int dv, float scale, int window) {
    __shared__ float s_max[ATT_WARPS], s_sum[ATT_WARPS];
    __shared__ float s_acc[ATT_WARPS][MAX_HEAD];
    int h = blockIdx.x, t = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int pos = start_pos + t;
    int first = window > 0 ? max(0, pos + 1 - window) : 0;
    int kv_head = h / (n_head / n_head_kv);
    int k_width = n_head_kv * dk, v_width = n_head_kv * dv;
    int nk = dk / 32, nv = dv / 32;
    const float* query = q + ((long long)t * n_head + h) * dk;
    float qr[PER_LANE], acc[PER_LANE];
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
        qr[i] = i < nk ? query[lane + 32 * i] : 0.0f;
        acc[i] = 0.0f;
    }
    float m = -__int_as_float(0x7f800000), l = 0.0f;  // -inf
    for (int p = first + warp; p <= pos; p += ATT_WARPS) {
        const u16* key = k_cache + (long long)p * k_width + kv_head * dk;
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < PER_LANE; ++i)
            if (i < nk) s = fmaf(qr[i], h2f(key[lane + 32 * i]), s);
        s = warp_sum(s) * scale;
        float m_new = fmaxf(m, s);
        float correction = expf(m - m_new), e = expf(s - m_new);
        l = l * correction + e;
        const u16* value = v_cache + (long long)p * v_width + kv_head * dv;
#pragma unroll
        for (int i = 0; i < PER_LANE; ++i)
            if (i < nv) acc[i] = fmaf(e, h2f(value[lane + 32 * i]), acc[i] * correction);
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
