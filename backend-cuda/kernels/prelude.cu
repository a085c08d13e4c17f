// Shared helpers of every kernel file. The files are concatenated into one NVRTC program
// (backend-cuda/src/module.rs), so this comes first and no CUDA header is needed: f16
// conversions are single PTX instructions.
//
// The program is compiled with --fmad=false: products and sums are rounded as written, like the
// CPU backend's Rust, and fused multiply-adds appear only where a kernel asks for fmaf.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;

__device__ __forceinline__ float h2f(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// Round to nearest even, as half::f16::from_f32.
__device__ __forceinline__ u16 f2h(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float ld_f16(const u8* p) { return h2f(*(const u16*)p); }

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
