// Routed experts (gpt-oss's mixture; llama.cpp's build_moe_ffn with SOFTMAX_WEIGHT gating).
// moe_route picks each row's experts from the router's logits and moe_group sorts the (row,
// slot) pairs by expert; moe_gate_up and moe_down multiply each expert's pairs by its matrices,
// found through tables of per-expert addresses on the device (so that a captured pass replays
// whatever the routing is), each weight loaded once for up to MOE_TOKENS pairs; moe_sum adds a
// row's slots into the residual stream, best first, as llama.cpp adds its views. A pair's
// arithmetic is its own: its results do not depend on the other rows of the pass.

// One thread per row: the `used` highest of `count` logits (bias included; the lower index
// first among equals), best first, weighted by the softmax of the chosen logits.
extern "C" __global__ void moe_route(const __grid_constant__ MoeRouteParams p) {
    int t = blockIdx.x * blockDim.x + threadIdx.x, count = p.count, used = p.used;
    if (t >= p.n) return;
    const float* row = p.logits + (long long)t * count;
    int* chosen = p.ids + (long long)t * used;
    float* weight = p.weights + (long long)t * used;
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

// Groups the n · used pairs by expert, in one block of 32 warps: offsets[e].. < offsets[e + 1]
// are expert e's positions in `order`, which holds the pairs in expert order and, within an
// expert, in pair order (counted by ballots, so the grouping is the same on every run);
// `active` lists the experts with pairs, in order, then -1 up to min(count, pairs) entries.
extern "C" __global__ void __launch_bounds__(1024)
moe_group(const __grid_constant__ MoeGroupParams args) {
    extern __shared__ int moe_counts[];
    const int* ids = args.ids;
    int pairs = args.pairs, count = args.count;
    int *offsets = args.offsets, *order = args.order, *active = args.active;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    unsigned below = (1u << lane) - 1u;
    for (int e = warp; e < count; e += warps) {
        int total = 0;
        for (int p0 = 0; p0 < pairs; p0 += 32) {
            int p = p0 + lane;
            total += __popc(__ballot_sync(0xffffffffu, p < pairs && ids[p] == e));
        }
        if (lane == 0) moe_counts[e] = total;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int running = 0, used = 0;
        for (int e = 0; e < count; ++e) {
            offsets[e] = running;
            running += moe_counts[e];
            if (moe_counts[e] > 0) active[used++] = e;
            moe_counts[e] = offsets[e];
        }
        offsets[count] = running;
        // The launches' grid.y covers min(count, pairs) experts: the rest are idle.
        for (int j = used; j < min(count, pairs); ++j) active[j] = -1;
    }
    __syncthreads();
    for (int e = warp; e < count; e += warps) {
        int next = moe_counts[e];
        for (int p0 = 0; p0 < pairs; p0 += 32) {
            int p = p0 + lane;
            bool mine = p < pairs && ids[p] == e;
            unsigned hits = __ballot_sync(0xffffffffu, mine);
            if (mine) order[next + __popc(hits & below)] = p;
            next += __popc(hits);
        }
    }
}

// sorted[k] = quantized input row order[k] / used (each pair's token's row), one block per k.
extern "C" __global__ void moe_gather(const __grid_constant__ MoeGatherParams p) {
    int k = blockIdx.x, bytes = p.bytes;
    const int4* src = (const int4*)(p.rows + (long long)(p.order[k] / p.used) * bytes);
    int4* dst = (int4*)(p.sorted + (long long)k * bytes);
    for (int i = threadIdx.x; i < bytes / 16; i += blockDim.x) dst[i] = src[i];
}

// Tokens of one expert a block multiplies per weight load (the batched qgemv's T): at 16 rows
// an expert has two or three pairs, and eight tokens' accumulators cost the warps' occupancy.
#define MOE_TOKENS 4

// Asks L1 for a warp's R weight rows of `bytes` each, the 128-byte lines spread over the lanes,
// so that a row's loads are all in flight at once: a 2880-wide row is three chunks a lane, and
// loading them one after another had each warp wait on memory three times in a row.
template <int R>
__device__ __forceinline__ void prefetch_rows(const Rows<R>& w, long long bytes, int lane) {
#pragma unroll
    for (int k = 0; k < R; ++k) {
        const u8* line = (const u8*)((unsigned long long)w.p[k] & ~127ull);
        for (const u8* p = line + 128 * lane; p < w.p[k] + bytes; p += 32 * 128)
            asm volatile("prefetch.global.L1 [%0];" ::"l"(p));
    }
}

// act[k][r] = swiglu_oai(gate_e[r] · x_k + gb_e[r], up_e[r] · x_k + ub_e[r]) for each position k
// of expert e = active[blockIdx.y] (offsets[e].. < offsets[e + 1]), x_k its pair's input, quantized in
// expert order at `sorted`: one warp per row r (grid.x over groups of QG_WARPS rows), each
// weight chunk loaded once for up to MOE_TOKENS positions, a position's sums the same whatever
// the others are.
extern "C" __global__ void __launch_bounds__(QG_WARPS * 32)
moe_gate_up(const __grid_constant__ MoeGateUpParams p) {
    long long row_bytes = p.row_bytes;
    int rows = p.rows, cols = p.cols;
    int e = p.active[blockIdx.y], warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int r = blockIdx.x * (blockDim.x >> 5) + warp;
    if (e < 0 || r >= rows) return;
    int first = p.offsets[e], last = p.offsets[e + 1];
    Rows<2> w;
    w.p[0] = p.gate_w[e] + (long long)r * row_bytes;
    w.p[1] = p.up_w[e] + (long long)r * row_bytes;
    prefetch_rows<2>(w, row_bytes, lane);
    long long bytes = qinput_bytes(cols);
    for (int k0 = first; k0 < last; k0 += MOE_TOKENS) {
        int count = min(MOE_TOKENS, last - k0);
        int index;
        float total = warp_row_totals<2, MOE_TOKENS>(p.format, w, lane, cols,
                                                     p.input + k0 * bytes, count, &index);
        // The up row's total for the same token sits in the lanes xor 16; each total is held
        // by 32 / (2 · MOE_TOKENS) lanes, of which the first writes.
        float up = __shfl_xor_sync(0xffffffffu, total, 16);
        int i = index % MOE_TOKENS;
        bool leader = (lane & (32 / (2 * MOE_TOKENS) - 1)) == 0 && index < MOE_TOKENS;
        if (leader && i < count)
            p.act[(long long)(k0 + i) * rows + r] =
                swiglu_oai(total + p.gate_b[e][r], up + p.up_b[e][r], p.alpha, p.limit);
    }
}

// out[order[k]][r] = (down_e[r] · act_k + db_e[r]) · weights[order[k]] for each position k of
// expert e = active[blockIdx.y], the activations quantized in expert order at `sorted`; one warp per
// row r, as moe_gate_up.
extern "C" __global__ void __launch_bounds__(QG_WARPS * 32)
moe_down(const __grid_constant__ MoeDownParams args) {
    long long row_bytes = args.row_bytes;
    int rows = args.rows, cols = args.cols;
    int e = args.active[blockIdx.y], warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int r = blockIdx.x * (blockDim.x >> 5) + warp;
    if (e < 0 || r >= rows) return;
    int first = args.offsets[e], last = args.offsets[e + 1];
    Rows<1> w;
    w.p[0] = args.down_w[e] + (long long)r * row_bytes;
    prefetch_rows<1>(w, row_bytes, lane);
    long long bytes = qinput_bytes(cols);
    for (int k0 = first; k0 < last; k0 += MOE_TOKENS) {
        int count = min(MOE_TOKENS, last - k0);
        int index;
        float total = warp_row_totals<1, MOE_TOKENS>(args.format, w, lane, cols,
                                                     args.input + k0 * bytes, count, &index);
        bool leader = (lane & (32 / MOE_TOKENS - 1)) == 0;
        if (leader && index < count) {
            int p = args.order[k0 + index];
            args.out[(long long)p * rows + r] = (total + args.down_b[e][r]) * args.weights[p];
        }
    }
}

// The same products for a pass of one row, pair p = blockIdx.y on its expert ids[p] alone (no
// grouping): the sums are those of moe_gate_up and moe_down (warp_row_totals, qgemv.cu's order),
// so a row's results do not depend on which kernel ran; with one token per expert the batched accumulators only cost registers.
extern "C" __global__ void __launch_bounds__(QG_WARPS * 32)
moe_pair_gate_up(const __grid_constant__ MoeGateUpParams args) {
    int p = blockIdx.y, e = args.ids[p], warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int r = blockIdx.x * (blockDim.x >> 5) + warp, rows = args.rows;
    if (r >= rows) return;
    Rows<2> w;
    w.p[0] = args.gate_w[e] + (long long)r * args.row_bytes;
    w.p[1] = args.up_w[e] + (long long)r * args.row_bytes;
    int index;
    float gate = warp_row_totals<2, 1>(args.format, w, lane, args.cols, args.input, 1, &index);
    float up = __shfl_xor_sync(0xffffffffu, gate, 16);
    if (lane == 0)
        args.act[(long long)p * rows + r] = swiglu_oai(
            gate + args.gate_b[e][r], up + args.up_b[e][r], args.alpha, args.limit);
}

extern "C" __global__ void __launch_bounds__(QG_WARPS * 32)
moe_pair_down(const __grid_constant__ MoeDownParams args) {
    int p = blockIdx.y, e = args.ids[p], warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int r = blockIdx.x * (blockDim.x >> 5) + warp, rows = args.rows;
    if (r >= rows) return;
    Rows<1> w;
    w.p[0] = args.down_w[e] + (long long)r * args.row_bytes;
    const u8* input = args.input + (long long)p * qinput_bytes(args.cols);
    int index;
    float v = warp_row_totals<1, 1>(args.format, w, lane, args.cols, input, 1, &index);
    if (lane == 0)
        args.out[(long long)p * rows + r] = (v + args.down_b[e][r]) * args.weights[p];
}

// x[t][i] += Σ_slot out[t · used + slot][i], the slots added best first.
extern "C" __global__ void moe_sum(const __grid_constant__ MoeSumParams p) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x, width = p.width;
    if (i >= (long long)p.n * width) return;
    long long t = i / width, c = i - t * width;
    const float* slots = p.out + t * p.used * width + c;
    float total = slots[0];
    for (int s = 1; s < p.used; ++s) total += slots[(long long)s * width];
    p.x[i] += total;
}
