// ptx/mma_sync.cuh -- warp-level tensor-core products (sm_80+): mma.sync.m16n8k16 with float32 accumulators,
// ldmatrix to load its operands from shared memory, and the conversions and shared-memory moves around them.
//
// Register layouts of mma.m16n8k16 (g = lane / 4, t = lane % 4; PTX ISA, "Matrix Fragments for mma.m16n8k16"):
//
//        A (16 x 16, row-major)         B (16 x 8, "col")        C/D (16 x 8, float32)
//        cols 0..7     cols 8..15        k rows 0..7 | 8..15      cols 2t, 2t+1
//   g   [ a0: (g,2t..2t+1) | a2 ]        b0 = B[2t..2t+1][g]     c0, c1 : row g
//   g+8 [ a1               | a3 ]        b1 = B[2t+8..+9][g]     c2, c3 : row g + 8
//
//   ldmatrix_x4(r, addr)        four 8x8 matrices of 16-bit values: lane l gives the address of row l % 8 of
//                               matrix l / 8 and gets, of matrix i, row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1
//                               in r[i] (an A fragment, or the B fragments of two n-tiles)
//   ldmatrix_x4_trans(r, addr)  the same, transposed: column l / 4, rows 2 (l % 4) and 2 (l % 4) + 1
//   mma_16816<BF16>(d, a, b0, b1)   d (16x8 float32) += a (16x16) * b (16x8), float16 or (BF16) bfloat16 operands
//   pack2<BF16>(lo, hi)         two floats -> one register of two 16-bit values, lo in the low half (round to nearest;
//                               float16 builds for sm_75 too, with two cvt.rn.f16.f32: kernels/cublas/cublas_half.cu)
//   st_shared_u32, ld_shared_v4 4 bytes to and 16 bytes from a shared-window address
//   st_shared_f32x4(addr, a, b, c, d)   four floats to a 16-byte aligned shared-window address
//   unpack2<BF16>(x)            one register of two 16-bit values -> float2 (low half in .x): pack2's inverse
#ifndef COURSE_PTX_MMA_SYNC_CUH
#define COURSE_PTX_MMA_SYNC_CUH

#include "common.cuh"

DEVICE void ldmatrix_x4(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
DEVICE void ldmatrix_x4_trans(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// Not volatile: the compiler may move an mma (it reads and writes registers only), which lets it interleave the
// products with the loads and the softmax around them.
template <bool BF16>
DEVICE void mma_16816(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    if constexpr (BF16) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}

template <bool BF16>
DEVICE u32 pack2(float lo, float hi) {
    u32 r;
    if constexpr (BF16) {
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800  // no cvt.rn.f16x2.f32 before sm_80: two conversions, one move
        u16 l, h;
        asm("cvt.rn.f16.f32 %0, %1;\n" : "=h"(l) : "f"(lo));
        asm("cvt.rn.f16.f32 %0, %1;\n" : "=h"(h) : "f"(hi));
        asm("mov.b32 %0, {%1, %2};\n" : "=r"(r) : "h"(l), "h"(h));
#else
        asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
#endif
    }
    return r;
}

DEVICE void st_shared_u32(u32 addr, u32 x) { asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(x) : "memory"); }
DEVICE void st_shared_f32x4(u32 addr, float a, float b, float c, float d) {
    asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}
DEVICE uint4 ld_shared_v4(u32 addr) {
    uint4 r;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "r"(addr)
                 : "memory");
    return r;
}

template <bool BF16>
DEVICE float2 unpack2(u32 x) {
    if constexpr (BF16) {
        return make_float2(__uint_as_float(x << 16), __uint_as_float(x & 0xffff0000u));
    } else {
        float lo, hi;
        asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.f32.f16 %0, l;\ncvt.f32.f16 %1, h;\n}\n"
            : "=f"(lo), "=f"(hi) : "r"(x));
        return make_float2(lo, hi);
    }
}

#endif  // COURSE_PTX_MMA_SYNC_CUH
