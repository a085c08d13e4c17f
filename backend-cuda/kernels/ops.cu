// Row and element-wise operations of the forward pass, each with the CPU backend's numerics
// (backend-cpu/src/ops.rs): f64 sum of squares in RMSNorm, RoPE angles by repeated f32
// multiplication, GELU on f16-rounded values.

// out = x / rms(x) * w per row of `width` (one block of 256 threads per row; in place allowed).
extern "C" __global__ void __launch_bounds__(256)
rms_norm(const __grid_constant__ RmsNormParams p) {
    int width = p.width;
    const float* row = p.x + (long long)blockIdx.x * width;
    float* dst = p.out + (long long)blockIdx.x * width;
    float scale = rms_scale(row, width, p.eps);
    for (int i = threadIdx.x; i < width; i += blockDim.x) dst[i] = (row[i] * scale) * p.w[i];
}

// Token row blockIdx.x at its position (`rows`): rotates the first `dims` elements of each of
// its n_head query heads (rows of q) and n_head_kv key heads (rows of k) in place, then appends
// its keys and values to one layer's f16 pool at the rows its page table gives. One
// thread per (head, pair); the angle of pair i is multiplied up i times in f32 as the CPU does,
// divided by factors[i] when the model has frequency factors (null otherwise), blended by YaRN's
// ramp when yarn_high ≥ 0 (rope_angle), and its cosine and sine scaled by attn_factor. `neox`
// pairs (i, i + dims/2), otherwise (2i, 2i + 1).
extern "C" __global__ void __launch_bounds__(256)
rope_store(const __grid_constant__ RopeStoreParams args) {
    const QRope& r = args.rope;
    int t = blockIdx.x, p = r.rows.pos[t], half_dims = r.dims / 2, head_dim = r.head_dim;
    int n_head = args.n_head, k_width = args.n_head_kv * head_dim, v_width = args.v_width;
    float* qt = args.q + (long long)t * n_head * head_dim;
    float* kt = args.k + (long long)t * k_width;
    for (int w = threadIdx.x; w < (n_head + args.n_head_kv) * half_dims; w += blockDim.x) {
        int h = w / half_dims, i = w - h * half_dims;
        float angle =
            rope_angle(p, i, r.theta_scale, r.freq_scale, r.factors, r.yarn_low, r.yarn_high);
        float s = sinf(angle) * r.attn_factor, c = cosf(angle) * r.attn_factor;
        int a = r.neox ? i : 2 * i, b = r.neox ? i + half_dims : 2 * i + 1;
        float* head = h < n_head ? qt + h * head_dim : kt + (h - n_head) * head_dim;
        float x0 = head[a], x1 = head[b];
        head[a] = x0 * c - x1 * s;
        head[b] = x0 * s + x1 * c;
    }
    __syncthreads();
    long long row = step_kv_row(r.rows, t, p);
    for (int j = threadIdx.x; j < k_width; j += blockDim.x)
        r.k_cache[row * k_width + j] = f2h(kt[j]);
    for (int j = threadIdx.x; j < v_width; j += blockDim.x)
        r.v_cache[row * v_width + j] = f2h(args.v[(long long)t * v_width + j]);
}


// x[i] += y[i].
extern "C" __global__ void add(const __grid_constant__ ElementwiseParams p) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < p.total;
         i += (long long)gridDim.x * blockDim.x)
        p.x[i] += p.y[i];
}

// out[t][j] = act(gate[t][j]) * up[t][j] for j < width, rows `stride` floats apart in the inputs
// (2·width for a fused [gate | up] row), `width` apart in out.
extern "C" __global__ void gated(const __grid_constant__ GatedParams p) {
    long long total = (long long)p.rows * p.width, stride = p.stride;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        long long t = i / p.width;
        int j = (int)(i - t * p.width);
        float g = p.gate[t * stride + j];
        p.out[i] = (p.use_gelu ? gelu_tanh(g) : silu(g)) * p.up[t * stride + j];
    }
}

// dst[t][j] = src[t][offset + j], j < width: one part of a fused projection's rows.
extern "C" __global__ void copy_cols(const __grid_constant__ CopyParams p) {
    long long total = (long long)p.rows * p.width;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        long long t = i / p.width;
        p.dst[i] = p.src[t * p.src_stride + p.offset + (int)(i - t * p.width)];
    }
}

// dst[i] = src[ids[i]], rows of `width` floats, i < rows: the rows a pass's head multiplies
// (the last of each chunk that wants logits).
extern "C" __global__ void gather_rows(const __grid_constant__ CopyParams p) {
    long long total = (long long)p.rows * p.width;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        long long r = i / p.width;
        p.dst[i] = p.src[(long long)p.ids[r] * p.width + (i - r * p.width)];
    }
}

// x = cap · tanh(x / cap).
extern "C" __global__ void softcap(const __grid_constant__ ElementwiseParams p) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < p.total;
         i += (long long)gridDim.x * blockDim.x)
        p.x[i] = tanhf(p.x[i] / p.cap) * p.cap;
}

// The greedy choice over n logits, as worker_common's sampler makes it at T = 0 without a
// penalty: the highest value, the lowest index on ties; 0xffffffff instead when any logit is
// NaN or infinite (the numerics guard: the host ends the job with MODEL_NUMERICS).
// Each block reduces a contiguous slice and writes its (value, index) to `partial`, the value
// NaN when its slice held a non-finite logit; the last block to finish (an atomic count, reset
// for the next replay, as attention_split's merge) reduces those in block order and stores the
// index as a u32 at `out`. Every step compares by one total order, so the result does not
// depend on scheduling. grid.y rows of logits (n apart), each with its own count, pairs and
// result. With `allowed` (a bitset per row, `allowed_words` words apart: bit id % 32 of word
// id / 32, ids past its words not allowed), only the ids it sets compete: a grammar's masked
// greedy choice (worker_common's masked_greedy_choice); every logit is still checked for NaN
// and infinity.
__device__ __forceinline__ bool better(float v, int i, float best, int best_i) {
    return v > best || (v == best && i < best_i);
}

// The best of each thread's (value, index) in the block, in thread 0.
__device__ void block_best(float* value, int* index) {
    __shared__ float s_value[32];
    __shared__ int s_index[32];
    for (int o = 16; o > 0; o >>= 1) {
        float v = __shfl_xor_sync(0xffffffffu, *value, o);
        int i = __shfl_xor_sync(0xffffffffu, *index, o);
        if (better(v, i, *value, *index)) *value = v, *index = i;
    }
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) s_value[warp] = *value, s_index[warp] = *index;
    __syncthreads();
    if (warp == 0) {
        int warps = blockDim.x >> 5;
        *value = lane < warps ? s_value[lane] : -__int_as_float(0x7f800000);
        *index = lane < warps ? s_index[lane] : 0x7fffffff;
        for (int o = 16; o > 0; o >>= 1) {
            float v = __shfl_xor_sync(0xffffffffu, *value, o);
            int i = __shfl_xor_sync(0xffffffffu, *index, o);
            if (better(v, i, *value, *index)) *value = v, *index = i;
        }
    }
}

extern "C" __global__ void __launch_bounds__(256)
argmax_logits(const __grid_constant__ ArgmaxParams p) {
    __shared__ bool s_last;
    int n = p.n, allowed_words = p.allowed_words;
    const float* logits = p.logits + (long long)blockIdx.y * n;
    const u32* allowed = p.allowed ? p.allowed + (long long)blockIdx.y * allowed_words : nullptr;
    u32* out = p.out + blockIdx.y;
    float* partial = p.partial + 2 * blockIdx.y * gridDim.x;
    u32* counter = p.counter + blockIdx.y;
    const float NEG_INF = -__int_as_float(0x7f800000), MAX = __int_as_float(0x7f7fffff);
    // Thread t of block b takes elements b·slice + t, + blockDim.x, … of its block's slice;
    // an element never seen stands as -inf at an index past every real one.
    int slice = (n + gridDim.x - 1) / gridDim.x, first = blockIdx.x * slice;
    int last = min(n, first + slice);
    float best = NEG_INF;
    int best_i = 0x7fffffff;
    int non_finite = 0;
    for (int i = first + threadIdx.x; i < last; i += blockDim.x) {
        float v = logits[i];
        non_finite |= (__float_as_int(v) & 0x7f800000) == 0x7f800000;
        if (allowed && ((i >> 5) >= allowed_words || !((allowed[i >> 5] >> (i & 31)) & 1u)))
            continue;
        v = v != v ? NEG_INF : fminf(v, MAX);
        if (better(v, i, best, best_i)) best = v, best_i = i;
    }
    non_finite = __syncthreads_or(non_finite);
    block_best(&best, &best_i);
    if (threadIdx.x == 0) {
        partial[2 * blockIdx.x] = non_finite ? __int_as_float(0x7fffffff) : best;
        partial[2 * blockIdx.x + 1] = __int_as_float(best_i);
        __threadfence();
        u32 done = atomicAdd(counter, 1u);
        s_last = done == gridDim.x - 1;
        if (s_last) *counter = 0;
    }
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    best = NEG_INF;
    best_i = 0x7fffffff;
    non_finite = 0;
    for (int b = threadIdx.x; b < gridDim.x; b += blockDim.x) {
        float v = __ldcg(partial + 2 * b);
        int i = __float_as_int(__ldcg(partial + 2 * b + 1));
        non_finite |= v != v;
        if (better(v, i, best, best_i)) best = v, best_i = i;
    }
    non_finite = __syncthreads_or(non_finite);
    block_best(&best, &best_i);
    if (threadIdx.x == 0) *out = non_finite ? 0xffffffffu : best == NEG_INF ? 0u : (u32)best_i;
}
