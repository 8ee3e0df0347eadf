// ptx/common.cuh -- what every PTX header and kernel file shares: short integer names, the DEVICE shorthand, a
// shared-memory address, 2^x on the special-function unit, and tanh for the soft-capping kernels.
//
// Copy this folder (kernels/ptx/) with any kernel file that includes it, and put its parent on the include path
// (nvcc -I kernels, NVRTC -I<kernels>): kernel files include the headers as "ptx/NAME.cuh". Every function here is
// one instruction or one conversion (the tanh helpers: a handful of arithmetic instructions), force-inlined: a wrapper
// costs nothing over writing the asm in place.
#ifndef COURSE_PTX_COMMON_CUH
#define COURSE_PTX_COMMON_CUH

typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#ifndef DEVICE
#define DEVICE __device__ __forceinline__
#endif

// The 32-bit shared-window address of a pointer into shared memory: what ldmatrix, cp.async, mbarrier and TMA take.
DEVICE u32 smem_addr(const void* p) { return static_cast<u32>(__cvta_generic_to_shared(p)); }

// 2^x with one MUFU.EX2 (ex2.approx.ftz.f32: relative error about 2^-22, subnormal results flushed to 0, 2^-inf = 0).
// exp2f() compiles to the same instruction plus a fix-up for results below 2^-126, which softmax never needs.
DEVICE float exp2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// tanh(x) = 1 - 2 / (2^(2 x log2 e) + 1): one MUFU.EX2 and a fast divide, an absolute error near 1e-7; +-1 for large
// |x| (2^... = inf or 0). The mma.sync kernels soft-cap with these two, forward and backward. A backward takes
// r = 1 - tanh, as 1 - tanh^2 = r (2 - r): computed as r, it keeps its relative precision where tanh saturates.
DEVICE float one_minus_tanh(float x) { return __fdividef(2.0f, exp2_ftz(x * 2.8853900817779268f) + 1.0f); }
DEVICE float tanh_exp2(float x) { return 1.0f - one_minus_tanh(x); }

// tanh(x) with one MUFU.TANH (tanh.approx.f32, sm_75 and later): one special-function operation where tanh_exp2 takes
// two, for a forward whose softmax already spends one per score on 2^x. Absolute error within 1e-5, which
// tests/test_hopper_variants_gpu.py checks on the GPU it runs on (the PTX ISA documents a looser bound; the
// measurement is in kernels/hopper/README.md, "The variants"). +-1 for large |x|, NaN for NaN.
DEVICE float tanh_approx(float x) {
    float y;
    asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

#endif  // COURSE_PTX_COMMON_CUH
