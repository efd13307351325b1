// Streaming pieces of the device-initiated all-to-all ("nvlink" dispatcher): a warp encodes a
// "unit" of 1024 consecutive elements of one row (bf16 input) into the wire format and stores it
// with 16-byte stores that are contiguous across the warp (512 bytes per store instruction), so
// that NVLink carries full sectors. Loads are split from encode/store so that callers can keep the
// next unit's loads in flight while encoding the current one.
//
// Element ownership inside a unit starting at element e0 (lane = 0..31):
//   bf16  : 16-byte chunks e0/8 + 32*i + lane, i = 0..3 (8 elements each);
//   fp8   : two groups of 16 elements, e0 + 512*g + 16*lane (g = 0, 1); 8 lanes share a 128-block;
//   nvfp4 : 32 elements e0 + 32*lane = the 16-element blocks 2*lane and 2*lane+1 of the unit.
// Encoding is quant/cuda/wire_device.cuh's, which rounds exactly like the CPU quantizers.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "epmoe/format.h"
#include "epmoe/numeric.h"
#include "quant/cuda/quant_device.cuh"
#include "quant/cuda/wire_device.cuh"

namespace epmoe::a2a {

constexpr int kUnitElems = 1024;  // elements of a row one warp handles per step

// Raw bf16 bits of one unit for one lane (64 bytes).
struct UnitRaw {
  uint4 v[4];
};

// The wire form of one unit for one lane.
struct UnitEnc {
  uint4 p[2];      // payload: bf16 uses UnitRaw instead; fp8 two 16-byte groups; nvfp4 p[0]
  float scale[2];  // fp8: scale of the block of group g
  uint32_t s2;     // nvfp4: the two e4m3 block scales (low byte = block 2*lane)
};

__device__ __forceinline__ int units_per_row(int H) { return (H + kUnitElems - 1) / kUnitElems; }

__device__ __forceinline__ uint4 ldg16(const void* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }
__device__ __forceinline__ uint4 zero4() { return make_uint4(0, 0, 0, 0); }

// ---- loads ---------------------------------------------------------------------------------------
template <ActFormat F>
__device__ __forceinline__ void unit_load(const bf16_raw* row, int H, int e0, UnitRaw& r) {
  const int lane = threadIdx.x & 31;
  if constexpr (F == ActFormat::bf16) {
    const int nch = H >> 3;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int c = (e0 >> 3) + 32 * i + lane;
      r.v[i] = c < nch ? ldg16(row + 8 * c) : zero4();
    }
  } else if constexpr (F == ActFormat::fp8) {
#pragma unroll
    for (int g = 0; g < 2; ++g) {
      const int e = e0 + 512 * g + 16 * lane;
      // H % 16 == 0: a lane's 16 elements are all on or off; in a partial last block the lanes past
      // H load zeros, which leave the block's amax as it is, and store nothing.
      const bool on = e < H;
      r.v[2 * g] = on ? ldg16(row + e) : zero4();
      r.v[2 * g + 1] = on ? ldg16(row + e + 8) : zero4();
    }
  } else {
    const int e = e0 + 32 * lane;
#pragma unroll
    for (int i = 0; i < 4; ++i) r.v[i] = e + 8 * i < H ? ldg16(row + e + 8 * i) : zero4();  // H % 16 == 0
  }
}

// ---- encode (the wire encoders of quant/cuda/wire_device.cuh) -------------------------------------
__device__ __forceinline__ void unit_encode_fp8(const UnitRaw& r, bool ue8m0, UnitEnc& o) {
#pragma unroll
  for (int g = 0; g < 2; ++g) o.scale[g] = cuda::dev::fp8_encode16(r.v[2 * g], r.v[2 * g + 1], ue8m0, o.p[g]);
}

__device__ __forceinline__ void unit_encode_nvfp4(const UnitRaw& r, float gs, UnitEnc& o) {
  uint32_t w0, w1, w2, w3;
  const uint32_t s0 = cuda::dev::nvfp4_encode16(r.v[0], r.v[1], gs, w0, w1);
  const uint32_t s1 = cuda::dev::nvfp4_encode16(r.v[2], r.v[3], gs, w2, w3);
  o.p[0] = make_uint4(w0, w1, w2, w3);
  o.s2 = s0 | (s1 << 8);
}

template <ActFormat F>
__device__ __forceinline__ void unit_encode(const UnitRaw& r, const QuantParams& q, UnitEnc& o) {
  if constexpr (F == ActFormat::fp8) unit_encode_fp8(r, q.ue8m0, o);
  else if constexpr (F == ActFormat::nvfp4) unit_encode_nvfp4(r, q.nvfp4_global_scale, o);
}

// ---- stores ----------------------------------------------------------------------------------------
// prow/srow: the destination row's payload and scales (row starts are 16-byte aligned for bf16 and
// fp8; nvfp4 rows are 8-byte aligned unless H % 32 == 0).
template <ActFormat F>
__device__ __forceinline__ void unit_store(const UnitRaw& r, const UnitEnc& o, int H, int e0, uint8_t* prow, uint8_t* srow) {
  const int lane = threadIdx.x & 31;
  if constexpr (F == ActFormat::bf16) {
    const int nch = H >> 3;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int c = (e0 >> 3) + 32 * i + lane;
      if (c < nch) reinterpret_cast<uint4*>(prow)[c] = r.v[i];
    }
  } else if constexpr (F == ActFormat::fp8) {
#pragma unroll
    for (int g = 0; g < 2; ++g) {
      const int e = e0 + 512 * g + 16 * lane;
      if (e < H) {
        *reinterpret_cast<uint4*>(prow + e) = o.p[g];
        if ((lane & 7) == 0) reinterpret_cast<float*>(srow)[e >> 7] = o.scale[g];
      }
    }
  } else {
    const int e = e0 + 32 * lane;
    if (e < H) {
      uint8_t* p = prow + (e >> 1);
      const bool both = e + 16 < H;
      if (both && (H & 31) == 0) {
        *reinterpret_cast<uint4*>(p) = o.p[0];
      } else {
        *reinterpret_cast<uint2*>(p) = make_uint2(o.p[0].x, o.p[0].y);
        if (both) *reinterpret_cast<uint2*>(p + 8) = make_uint2(o.p[0].z, o.p[0].w);
      }
      srow[e >> 4] = static_cast<uint8_t>(o.s2);
      if (both) srow[(e >> 4) + 1] = static_cast<uint8_t>(o.s2 >> 8);
    }
  }
}

// ---- combine sum -----------------------------------------------------------------------------------
// acc[i][0..7] += the 8 elements of chunk i (e0/8 + 32*i + lane) of one partial row, in fp32 with
// no fma (reduce.h). bf16 rows: 16 bytes per chunk; fp8 rows: 8 bytes and the block's fp32 scale.
template <ActFormat CF>
__device__ __forceinline__ void sum_load(const uint8_t* prow, const uint8_t* srow, int H, int e0, uint4* v, float* sc) {
  const int lane = threadIdx.x & 31;
  const int nch = H >> 3;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int c = (e0 >> 3) + 32 * i + lane;
    if constexpr (CF == ActFormat::bf16) {
      v[i] = c < nch ? *reinterpret_cast<const uint4*>(prow + 16 * size_t(c)) : zero4();
    } else {
      const uint2 w = c < nch ? *reinterpret_cast<const uint2*>(prow + 8 * size_t(c)) : make_uint2(0, 0);
      v[i] = make_uint4(w.x, w.y, 0, 0);
      sc[i] = c < nch ? reinterpret_cast<const float*>(srow)[c >> 4] : 0.f;
    }
  }
}

template <ActFormat CF>
__device__ __forceinline__ void sum_add(float (*acc)[8], const uint4* v, const float* sc) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (CF == ActFormat::bf16) {
      const uint32_t w[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        acc[i][2 * k] = __fadd_rn(acc[i][2 * k], cuda::dev::bf_lo(w[k]));
        acc[i][2 * k + 1] = __fadd_rn(acc[i][2 * k + 1], cuda::dev::bf_hi(w[k]));
      }
    } else {
      const uint32_t w[2] = {v[i].x, v[i].y};
#pragma unroll
      for (int k = 0; k < 8; ++k)
        acc[i][k] = __fadd_rn(acc[i][k], cuda::dev::fp8_dequant(static_cast<uint8_t>(w[k / 4] >> (8 * (k % 4))), sc[i]));
    }
  }
}

// One chunk of the sum of at most two partials (n = 0, 1 or 2; ascending rank): +0, then a, then
// b, in fp32 without fma; returns the 8 bf16 results.
template <ActFormat CF>
__device__ __forceinline__ uint4 sum_chunk2(int n, const uint4& a, float sa, const uint4& b, float sb) {
  float acc[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) acc[k] = 0.f;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (r >= n) break;
    const uint4& v = r == 0 ? a : b;
    if constexpr (CF == ActFormat::bf16) {
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        acc[2 * k] = __fadd_rn(acc[2 * k], cuda::dev::bf_lo(w[k]));
        acc[2 * k + 1] = __fadd_rn(acc[2 * k + 1], cuda::dev::bf_hi(w[k]));
      }
    } else {
      const float sc = r == 0 ? sa : sb;
      const uint32_t w[2] = {v.x, v.y};
#pragma unroll
      for (int k = 0; k < 8; ++k)
        acc[k] = __fadd_rn(acc[k], cuda::dev::fp8_dequant(static_cast<uint8_t>(w[k / 4] >> (8 * (k % 4))), sc));
    }
  }
  uint32_t o[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) o[k] = cuda::dev::bf16x2_exact(acc[2 * k], acc[2 * k + 1]);
  return make_uint4(o[0], o[1], o[2], o[3]);
}

__device__ __forceinline__ void sum_store(const float (*acc)[8], int H, int e0, bf16_raw* out_row) {
  const int lane = threadIdx.x & 31;
  const int nch = H >> 3;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int c = (e0 >> 3) + 32 * i + lane;
    if (c >= nch) continue;
    uint32_t o[4];
#pragma unroll
    for (int k = 0; k < 4; ++k)
      o[k] = cuda::dev::bf16x2_exact(acc[i][2 * k], acc[i][2 * k + 1]);
    reinterpret_cast<uint4*>(out_row)[c] = make_uint4(o[0], o[1], o[2], o[3]);
  }
}

}  // namespace epmoe::a2a

namespace epmoe::a2a {

// ---- cp.async pipelines ------------------------------------------------------------------------------
// Loads that land in shared memory without holding registers, so that a warp keeps several units in
// flight (Little's law: 24 SMs need ~1-2 MB in flight to stream at HBM/NVLink rates). cp.async is a
// weak load performed by the issuing thread: data written by a peer is read only after the flag that
// released it was acquired (and the warp synchronised), exactly as for ordinary loads. Each lane
// reads back only what it copied itself, so cp.async.wait_group alone makes it visible.
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16 bytes global -> shared, L2 only; `bytes` = 16 or 0 (0: zero fill, nothing read).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)),
               "l"(__cvta_generic_to_global(src)), "r"(bytes)
               : "memory");
}
// 4 bytes global -> shared; `bytes` = 4 or 0.
__device__ __forceinline__ void cp_async4(void* dst, const void* src, int bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(smem_addr(dst)),
               "l"(__cvta_generic_to_global(src)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// One unit's bf16 input for one lane, in the element order of unit_load (chunk i of UnitRaw at
// stage[i * 32 + lane]).
template <ActFormat F>
__device__ __forceinline__ void unit_load_async(const bf16_raw* row, int H, int e0, uint4* stage) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    int e;  // first element of chunk i of this lane
    if constexpr (F == ActFormat::bf16) e = e0 + 8 * (32 * i + lane);
    else if constexpr (F == ActFormat::fp8) e = e0 + 512 * (i >> 1) + 16 * lane + 8 * (i & 1);
    else e = e0 + 32 * lane + 8 * i;
    bool on;
    if constexpr (F == ActFormat::fp8) on = e0 + 512 * (i >> 1) + 16 * lane < H;  // whole 128-blocks
    else on = e < H;
    cp_async16(stage + i * 32 + lane, on ? row + e : row, on ? 16 : 0);
  }
}
template <ActFormat F>
__device__ __forceinline__ void unit_from_stage(const uint4* stage, UnitRaw& r) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int i = 0; i < 4; ++i) r.v[i] = stage[i * 32 + lane];
}

}  // namespace epmoe::a2a
