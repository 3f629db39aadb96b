// Device helpers for tensor-core tiles on sm_80+ (sm_90 here): asynchronous 16-byte copies
// into shared memory, the m16n8k16 matrix product with float32 accumulators, and the
// 16-bit element types it takes. Framework-free: raw pointers and PTX only.
//
// Fragment layouts of mma.sync.m16n8k16 (PTX ISA, "Matrix Fragments for mma.m16n8k16"),
// with lane = 4 * g + t (g = lane / 4 in 0..7, t = lane % 4 in 0..3), two 16-bit elements
// per 32-bit register, the lower column / k index in the low half:
//   A [16 x 16] row-major: a[0] = (row g, k 2t..2t+1), a[1] = (row g+8, k 2t..2t+1),
//                          a[2] = (row g, k 2t+8..2t+9), a[3] = (row g+8, k 2t+8..2t+9)
//   B [16 x 8] (k x n):    b[0] = (k 2t..2t+1, col g), b[1] = (k 2t+8..2t+9, col g)
//   C [16 x 8] float:      c[0], c[1] = (row g, col 2t, 2t+1); c[2], c[3] = (row g+8, same cols)
// So a C tile pair (keys 0..7, keys 8..15) packed to 16 bits is exactly an A fragment over
// k = those 16 keys, which lets attention probabilities feed the second product directly.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace specops {

// The 16-bit input types of the products: conversions and the PTX type name.
struct HalfElement {
  static constexpr bool kIsBf16 = false;
  __device__ __forceinline__ static uint32_t pack(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);  // .x = lo goes to the low 16 bits
    return *reinterpret_cast<const uint32_t*>(&h);
  }
  __device__ __forceinline__ static uint16_t from_float(float x) { return __half_as_ushort(__float2half_rn(x)); }
};

struct Bf16Element {
  static constexpr bool kIsBf16 = true;
  __device__ __forceinline__ static uint32_t pack(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
  __device__ __forceinline__ static uint16_t from_float(float x) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
  }
};

// d += a * b on one m16n8k16 tile, float32 accumulators.
template <typename Element>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  if constexpr (Element::kIsBf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
}

// Copies 16 bytes from global to shared memory without staging in registers; when `fill`
// is false nothing is read and the 16 bytes are zeroed (src-size 0), so masked rows never
// carry stale or NaN data into a product. Both addresses must be 16-byte aligned.
__device__ __forceinline__ void cp_async_16(void* shared_dst, const void* global_src, bool fill) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(shared_dst));
  const int src_bytes = fill ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(global_src), "r"(src_bytes)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Waits until at most `kPending` of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Four 8x8 matrices of 16-bit elements from shared memory, one per register: lanes 8i to
// 8i + 7 give the addresses of matrix i's rows (16 bytes each, 16-byte aligned), and lane
// 4g + t receives row g, columns 2t and 2t + 1 of each matrix (with `kTranspose`, of its
// transpose: rows 2t and 2t + 1 of column g), the fragment layouts above.
template <bool kTranspose>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const uint16_t* row) {
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  if constexpr (kTranspose) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
  }
}

// Two 16-bit elements from different rows, `lo` in the low half.
__device__ __forceinline__ uint32_t pack_pair(uint16_t lo, uint16_t hi) {
  return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
}

}  // namespace specops
