// Routed experts of a pass of long chunks on int8 tensor cores: moe_gate_up's and moe_down's
// products (moe.cu: the pairs grouped by expert, inputs quantized in expert order at `sorted`)
// by qgemm.cu's tiles and sums, so a pair's results follow qgemv.cu's order (the pairwise tree
// within each segment, segments in order) and do not depend on the other pairs. A block takes
// QmSmall's tile of weight rows of expert active[blockIdx.y] (gate and up rows side by side as
// in the gated mode) and runs over all of that expert's pairs, 32 at a time, so the grid does
// not depend on the routing.

typedef QmSmall MoeShape;

// The block's tile of expert e's matrix (gate and up: gated slots of two rows, as qm_block).
__device__ __forceinline__ QmBlock moe_block(u8* w, long long row_bytes, int rows,
                                             int format, bool gated) {
    int per_tile = gated ? MoeShape::BM / 2 : MoeShape::BM;
    QMatrix m = {w, row_bytes, nullptr, nullptr, rows, format};
    return QmBlock{m, (int)blockIdx.x * per_tile, rows, 0};
}

// Runs a block's tile (its rows as qm_tile_rows picks them for `mode`, `second` the up matrix
// in the gated mode) over expert e's n pairs, BN at a time, and hands each pass's accumulators
// to `put(acc, t, wm, g)`: the pass's first pair t0 plus this lane's column offset, the warp's
// first tile row and the lane's row in its 8-row group.
template <typename C, typename S, typename Put>
__device__ __forceinline__ void moe_gemm_passes(QmTiles<S>& sh, const QmBlock& b,
                                                const QMatrix& second, int mode, int cols,
                                                const u8* pre, int n, Put put) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int wm = (warp % S::WM) * 16 * S::MT, wn = (warp / S::WM) * 8 * S::NT;
    QRope none = {};
    const u8* wrows[S::WPAIRS];
    qm_tile_rows<S>(b, b.m, second, none, mode, wrows);
    for (int t0 = 0; t0 < n; t0 += S::BN) {
        float acc[S::MT][S::NT][4];
        qm_products<C, S>(sh, wrows, t0, n, cols, pre, 0, cols >> 5, acc);
        put(acc, t0 + wn + 2 * (lane & 3), wm, lane >> 2);
    }
}

// act[k][slot] = swiglu_oai(gate · x_k + gate bias, up · x_k + up bias) for the pairs k of
// expert e (first + t for t < n), from the totals of a gated tile (a slot's gate total in
// outputs 0, 1 and its up total in 2, 3).
template <typename C, typename S>
__device__ void moe_gemm_gate_up_tile(QmTiles<S>& sh, const QmBlock& b, const QMatrix& up,
                                      const float* gate_b, const float* up_b, int cols,
                                      const u8* pre, int first, int n, float alpha, float limit,
                                      float* act) {
    moe_gemm_passes<C, S>(sh, b, up, QG_SILU, cols, pre, n,
                          [&](const float (&acc)[S::MT][S::NT][4], int t1, int wm, int g) {
#pragma unroll
        for (int mt = 0; mt < S::MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < S::NT; ++nt)
#pragma unroll
                for (int i = 0; i < 2; ++i) {
                    int t = t1 + 8 * nt + i;
                    int slot = b.slot0 + ((wm >> 4) + mt) * 8 + g;
                    if (t >= n || slot >= b.slots) continue;
                    act[(long long)(first + t) * b.slots + slot] =
                        swiglu_oai(acc[mt][nt][i] + gate_b[slot], acc[mt][nt][i + 2] + up_b[slot],
                                   alpha, limit);
                }
    });
}

// out[order[k]][r] = (down · act_k + down bias) · weights[order[k]] for the pairs k of expert
// e (first + t for t < n).
template <typename C, typename S>
__device__ void moe_gemm_down_tile(QmTiles<S>& sh, const QmBlock& b, const float* down_b,
                                   int cols, const u8* pre, int first, int n, const int* order,
                                   const float* weights, float* out) {
    moe_gemm_passes<C, S>(sh, b, b.m, QG_STORE, cols, pre, n,
                          [&](const float (&acc)[S::MT][S::NT][4], int t1, int wm, int g) {
#pragma unroll
        for (int mt = 0; mt < S::MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < S::NT; ++nt)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    int t = t1 + 8 * nt + (i & 1);
                    int r = b.slot0 + wm + 16 * mt + g + 8 * (i >> 1);
                    if (t >= n || r >= b.m.rows) continue;
                    int p = order[first + t];
                    out[(long long)p * b.m.rows + r] = (acc[mt][nt][i] + down_b[r]) * weights[p];
                }
    });
}

// moe_gate_up's launch (the same arguments) on tensor cores: grid.x over tiles of BM / 2 slots.
extern "C" __global__ void __launch_bounds__(MoeShape::THREADS, MoeShape::BLOCKS)
moe_gemm_gate_up(const __grid_constant__ MoeGateUpParams p) {
    __shared__ __align__(16) QmTiles<MoeShape> sh;
    int e = p.active[blockIdx.y];
    if (e < 0) return;
    int first = p.offsets[e], n = p.offsets[e + 1] - first;
    QmBlock b = moe_block(p.gate_w[e], p.row_bytes, p.rows, p.format, true);
    QMatrix up = {p.up_w[e], p.row_bytes, nullptr, nullptr, p.rows, p.format};
    const u8* pre = p.input + (long long)first * qinput_bytes(p.cols);
    QM_DISPATCH(p.format, moe_gemm_gate_up_tile, MoeShape, sh, b, up, p.gate_b[e], p.up_b[e],
                p.cols, pre, first, n, p.alpha, p.limit, p.act);
}

// moe_down's launch (the same arguments) on tensor cores: grid.x over tiles of BM rows.
extern "C" __global__ void __launch_bounds__(MoeShape::THREADS, MoeShape::BLOCKS)
moe_gemm_down(const __grid_constant__ MoeDownParams p) {
    __shared__ __align__(16) QmTiles<MoeShape> sh;
    int e = p.active[blockIdx.y];
    if (e < 0) return;
    int first = p.offsets[e], n = p.offsets[e + 1] - first;
    QmBlock b = moe_block(p.down_w[e], p.row_bytes, p.rows, p.format, false);
    const u8* pre = p.input + (long long)first * qinput_bytes(p.cols);
    QM_DISPATCH(p.format, moe_gemm_down_tile, MoeShape, sh, b, p.down_b[e], p.cols, pre, first, n,
                p.order, p.weights, p.out);
}
