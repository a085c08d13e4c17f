// Routed experts (gpt-oss's mixture; llama.cpp's build_moe_ffn with SOFTMAX_WEIGHT gating).
// moe_route picks each row's experts from the router's logits; moe_gate_up and moe_down multiply
// each (row, slot) pair by its expert's matrices, found through tables of per-expert addresses
// on the device, so that a captured pass replays whatever the routing is; moe_sum adds a row's
// slots into the residual stream, best first, as llama.cpp adds its views. A pair's arithmetic
// is its own: its results do not depend on the other rows of the pass.

// One thread per row: the `used` highest of `count` logits (bias included; the lower index
// first among equals), best first, weighted by the softmax of the chosen logits.
extern "C" __global__ void moe_route(const float* logits, int count, int used, int n, int* ids,
                                     float* weights) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n) return;
    const float* row = logits + (long long)t * count;
    int* chosen = ids + (long long)t * used;
    float* weight = weights + (long long)t * used;
    for (int j = 0; j < used; ++j) {
        int best = -1;
        float best_logit = 0.0f;
        for (int e = 0; e < count; ++e) {
            bool taken = false;
            for (int i = 0; i < j; ++i) taken = taken || chosen[i] == e;
            if (!taken && (best < 0 || row[e] > best_logit)) {
                best = e;
                best_logit = row[e];
            }
        }
        chosen[j] = best;
        weight[j] = best_logit;
    }
    float top = weight[0], sum = 0.0f;
    for (int j = 0; j < used; ++j) {
        weight[j] = expf(weight[j] - top);
        sum += weight[j];
    }
    for (int j = 0; j < used; ++j) weight[j] /= sum;
}

// gpt-oss's clamped SwiGLU (ggml's swiglu_oai).
__device__ __forceinline__ float swiglu_oai(float gate, float up, float alpha, float limit) {
    float x = fminf(gate, limit), y = fminf(fmaxf(up, -limit), limit);
    return x / (1.0f + expf(alpha * -x)) * (y + 1.0f);
}

// act[p][r] = swiglu_oai(gate_e[r] · x[p / used] + gb_e[r], up_e[r] · x[p / used] + ub_e[r]) for
// pair p = blockIdx.x routed to expert e = ids[p]: one warp per row r (grid.y over groups of
// QG_WARPS rows), the input rows quantized once (quantize_rows) at `pre`.
extern "C" __global__ void __launch_bounds__(QG_WARPS * 32)
moe_gate_up(const u8* const* gate_w, const u8* const* up_w, const float* const* gate_b,
            const float* const* up_b, long long row_bytes, int rows, int format, int cols,
            const u8* pre, const int* ids, int used, float alpha, float limit, float* act) {
    int p = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int r = blockIdx.y * (blockDim.x >> 5) + warp;
    if (r >= rows) return;
    int e = ids[p];
    Rows<2> w;
    w.p[0] = gate_w[e] + (long long)r * row_bytes;
    w.p[1] = up_w[e] + (long long)r * row_bytes;
    const u8* input = pre + (long long)(p / used) * qinput_bytes(cols);
    Sums<2> sums = dot_rows_of<2, 1>(format, w, 0, cols >> 5, lane, cols, input, 1);
    float gate = warp_sum(sums.v[0]), up = warp_sum(sums.v[1]);
    if (lane == 0)
        act[(long long)p * rows + r] =
            swiglu_oai(gate + gate_b[e][r], up + up_b[e][r], alpha, limit);
}

// out[p][r] = (down_e[r] · act[p] + db_e[r]) · weights[p] for pair p = blockIdx.x routed to
// expert e = ids[p], the activations quantized once at `pre`; one warp per row r.
extern "C" __global__ void __launch_bounds__(QG_WARPS * 32)
moe_down(const u8* const* down_w, const float* const* down_b, long long row_bytes, int rows,
         int format, int cols, const u8* pre, const int* ids, const float* weights, float* out) {
    int p = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int r = blockIdx.y * (blockDim.x >> 5) + warp;
    if (r >= rows) return;
    int e = ids[p];
    Rows<1> w;
    w.p[0] = down_w[e] + (long long)r * row_bytes;
    const u8* input = pre + (long long)p * qinput_bytes(cols);
    Sums<1> sums = dot_rows_of<1, 1>(format, w, 0, cols >> 5, lane, cols, input, 1);
    float v = warp_sum(sums.v[0]);
    if (lane == 0) out[(long long)p * rows + r] = (v + down_b[e][r]) * weights[p];
}

// x[t][i] += Σ_slot out[t · used + slot][i], the slots added best first.
extern "C" __global__ void moe_sum(const float* out, int used, int width, int n, float* x) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)n * width) return;
    long long t = i / width, c = i - t * width;
    const float* slots = out + t * used * width + c;
    float total = slots[0];
    for (int s = 1; s < used; ++s) total += slots[(long long)s * width];
    x[i] += total;
}
