// Row and element-wise operations of the forward pass, each with the CPU backend's numerics
// (backend-cpu/src/ops.rs): f64 sum of squares in RMSNorm, RoPE angles by repeated f32
// multiplication, GELU on f16-rounded values.

// out = x / rms(x) * w per row of `width` (one block of 256 threads per row; in place allowed).
extern "C" __global__ void __launch_bounds__(256)
rms_norm(const float* x, const float* w, float* out, int width, float eps) {
    __shared__ double partial[256];
    const float* row = x + (long long)blockIdx.x * width;
    float* dst = out + (long long)blockIdx.x * width;
    double sum = 0.0;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        float v = row[i];
        sum += (double)(v * v);
    }
    partial[threadIdx.x] = sum;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
        __syncthreads();
    }
    float mean = (float)(partial[0] / (double)width);
    float scale = 1.0f / sqrtf(mean + eps);
    for (int i = threadIdx.x; i < width; i += blockDim.x) dst[i] = (row[i] * scale) * w[i];
}

// Rotates the first `dims` elements of every head of `n_heads` heads of `head_dim` in each of
// grid.x token rows (`row_stride` floats apart), the token at position start_pos + blockIdx.x.
// One thread per pair; `neox` pairs (i, i + dims/2), otherwise (2i, 2i + 1).
extern "C" __global__ void rope(float* x, int row_stride, int n_heads, int head_dim, int dims,
                                int start_pos, float theta_scale, float freq_scale, int neox) {
    int i = threadIdx.x, half_dims = dims / 2;
    if (i >= half_dims) return;
    float theta = (float)(start_pos + (int)blockIdx.x);
    for (int k = 0; k < i; ++k) theta *= theta_scale;
    float angle = freq_scale * theta;
    float s = sinf(angle), c = cosf(angle);
    int a = neox ? i : 2 * i, b = neox ? i + half_dims : 2 * i + 1;
    float* row = x + (long long)blockIdx.x * row_stride;
    for (int h = 0; h < n_heads; ++h) {
        float* head = row + h * head_dim;
        float x0 = head[a], x1 = head[b];
        head[a] = x0 * c - x1 * s;
        head[b] = x0 * s + x1 * c;
    }
}

// x[i] += b[i % width], i < total.
extern "C" __global__ void add_bias(float* x, const float* b, int width, long long total) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x)
        x[i] += b[i % width];
}

// x[i] += y[i].
extern "C" __global__ void add(float* x, const float* y, long long total) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x)
        x[i] += y[i];
}

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

// ggml's GELU_FP16 table: the input and the result rounded to f16.
__device__ __forceinline__ float gelu_tanh(float x) {
    const float SQRT_2_OVER_PI = 0.7978846f, COEF_A = 0.044715f;
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return x;
    x = h2f(f2h(x));
    float y = 0.5f * x * (1.0f + tanhf(SQRT_2_OVER_PI * x * (1.0f + COEF_A * x * x)));
    return h2f(f2h(y));
}

// out[t][j] = act(gate[t][j]) * up[t][j] for j < width, rows `stride` floats apart in the inputs
// (2·width for a fused [gate | up] row), `width` apart in out.
extern "C" __global__ void gated(const float* gate, const float* up, float* out, int width,
                                 int stride, int rows, int use_gelu) {
    long long total = (long long)rows * width;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        long long t = i / width;
        int j = (int)(i - t * width);
        float g = gate[t * stride + j];
        out[i] = (use_gelu ? gelu_tanh(g) : silu(g)) * up[t * stride + j];
    }
}

// dst[t][j] = src[t][offset + j], j < width: one part of a fused projection's rows.
extern "C" __global__ void copy_cols(const float* src, int src_stride, int offset, float* dst,
                                     int width, int rows) {
    long long total = (long long)rows * width;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        long long t = i / width;
        dst[i] = src[t * src_stride + offset + (int)(i - t * width)];
    }
}

// Appends n positions of keys and values to one layer's f16 cache at start_pos.
extern "C" __global__ void kv_store(const float* k, const float* v, u16* k_cache, u16* v_cache,
                                    int n, int start_pos, int k_width, int v_width) {
    long long kn = (long long)n * k_width, vn = (long long)n * v_width;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < kn + vn;
         i += (long long)gridDim.x * blockDim.x) {
        if (i < kn)
            k_cache[(long long)start_pos * k_width + i] = f2h(k[i]);
        else
            v_cache[(long long)start_pos * v_width + (i - kn)] = f2h(v[i - kn]);
    }
}

// x = cap · tanh(x / cap).
extern "C" __global__ void softcap(float* x, float cap, long long total) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x)
        x[i] = tanhf(x[i] / cap) * cap;
}
