// Device side of the "nvlink" dispatcher: one-sided pushes into peers' symmetric windows, flags with
// system-scope release/acquire, bounded waits that leave an error record instead of hanging.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "dispatch/a2a/device.cuh"
#include "dispatch/a2a/units.cuh"
#include "dispatch/check_codes.h"
#include "epmoe/options.h"
#include "dispatch/nvlink/nvlink_trace.h"

namespace epmoe::nvl {

constexpr int kThreads = 512;
constexpr int kStatusBytes = 64;

// Byte offsets inside every rank's window (identical on all ranks).
struct Layout {
  size_t status;    // [R] Status, written by source s into slot s
  size_t arrive_d;  // [R] u64: dispatch CTAs of source s that finished writing here (monotone)
  size_t payload, scales, ids, weights;  // dispatch receive [R][C]
  size_t cpayload, cscales;              // combine receive [R][C] (region = the rank that ran the slot)
  size_t cflag;     // [R][C] u64: combine epoch of the row at [d][j], released by its writer d
  size_t total;
};

// What a source tells each destination before any payload moves; `epoch` is released last.
struct Status {
  uint64_t epoch;
  int32_t count;  // tokens coming to this destination
  int32_t code;   // input::kOk, else the source's input problem (check_codes.h)
  int32_t T, bad_t, bad_k, bad_id;  // bad_id: the id (kBadId) or the NullField (kNullInput)
  int32_t grid;   // CTAs of the source's dispatch kernel = arrivals it adds to every destination
};
static_assert(sizeof(Status) <= kStatusBytes, "status slot");

using namespace epmoe::detail::input;
enum : int32_t { kErrNone = 0, kErrTimeout = 1, kErrUsage = 2 };
enum : int32_t { kAtStatus = 1, kAtDispatchData = 2, kAtCombineData = 3, kAtGridBarrier = 4 };

// Host-mapped error record: written by the device, read by the host without synchronising.
struct ErrorRecord {
  int32_t code;
  int32_t rank;   // timeout: the rank that did not arrive
  int32_t where;  // kAt*
  int32_t pad;
  int32_t bad[a2a::kMaxRanks][kRecordInts];  // usage: per source rank its input record (check_codes.h)
};

// Local (non-window) device state; lives across calls so that CUDA-graph replays stay consistent.
// Fields a dispatch kernel reads at its start are written only by its CTA 0 at its very end, after
// it saw every CTA of the kernel arrive (so no CTA can read a value of the next call).
struct State {
  uint64_t epoch;     // the epoch of the next dispatch (starts at 1)
  uint64_t grid_bar;  // this rank's in-kernel grid barrier (monotone, G per dispatch)
  int32_t bad;        // first bad (t*K + k) of this call, INT_MAX when none
  int32_t failed;     // the last dispatch was rejected (bad input somewhere): combine moves nothing
  int32_t abort;      // a wait timed out: every later wait gives up at once
  int32_t pad;
  uint64_t combines;  // dispatches that succeeded = the epoch of the combine rows' flags
  int32_t counts[a2a::kMaxRanks];      // valid slots per source (DispatchOutput::counts)
  int32_t prev_n[2][a2a::kMaxRanks];   // counts of the call of epoch parity p (ids past them are -1)
  uint64_t arrivals[a2a::kMaxRanks];   // dispatch arrivals expected so far from each source (sum of its G)
};

struct Args {
  ActFormat f, cf;
  QuantParams q;
  a2a::DevPlacement p;
  int R, me, C, H, K, E, E_loc;
  int64_t T;
  int64_t T_in;  // T as the caller passed it (reported in errors; T is 0 for a rejected input)
  int32_t local_code;   // this rank's input problem found on the host (check_input_shape)
  int32_t local_value;  // and its record value
  int64_t timeout_ns;
  const bf16_raw* hidden;
  const int32_t* ids;
  const float* w;
  const bf16_raw* y;  // combine
  bf16_raw* out;      // combine
  Layout L;
  uint8_t* const* peer_base;  // [R] window base of every rank (own = local pointer)
  State* S;
  ErrorRecord* err;  // device view of the host-mapped record
  int32_t* chunk_counts;  // [G][R]
  int32_t* slot_map;      // [C][R]
  int32_t* expert_counts; // [E_loc]
  uint64_t* trace;        // optional [kNvlTrace] phase stamps of CTA 0 (nvlink_trace.h); null: off
  int push_warps;  // combine warps per CTA that push rows (Tuning::push_warps)
  // Combine rows moved by the copy engine (0: by the push warps): rows per copy, and the flag of a
  // row is the flag of its copy's first row (nvlink_dispatcher.cu, "copy-engine combine").
  int ce_rows;
};

// The flag that releases combine row j of source s.
__device__ __forceinline__ size_t combine_flag_row(const Args& a, int s, int j) {
  return size_t(s) * a.C + (a.ce_rows > 0 ? j - j % a.ce_rows : j);
}

// CTA 0, thread 0: the global timer at trace point i (when tracing).
__device__ __forceinline__ void trace_point(const Args& a, int i) {
  if (a.trace && blockIdx.x == 0 && threadIdx.x == 0) {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    a.trace[i] = t;
  }
}

// Every CTA, thread 0: folds now into span slots, when tracing: `first` gets the minimum, `last_inv`
// the minimum of the complement (i.e. the maximum).
__device__ __forceinline__ void trace_span(const Args& a, int first, int last_inv) {
  if (a.trace && threadIdx.x == 0) {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    atomicMin(reinterpret_cast<unsigned long long*>(a.trace + first), static_cast<unsigned long long>(t));
    atomicMin(reinterpret_cast<unsigned long long*>(a.trace + last_inv), static_cast<unsigned long long>(~t));
  }
}

constexpr int kHist = 1024;      // local experts counted in shared memory (more: global atomics)
// Combine: warps per CTA that push rows (Tuning::push_warps, default 6); the others sum. Measured
// (2xH200, 24 SMs, 4096 DeepSeek-V3 tokens, bf16 combine): 4 / 5 / 6 / 8 / 10 / 12 push warps ->
// 269 / 260 / 247-252 / 281 / 346 / 436 us; with 8 the sums fall behind the pushes (58 us tail),
// with 5 or fewer the pushes are the limit.
constexpr int kStages = 4;       // cp.async stages per warp (dispatch units, combine sum units)
// Dynamic shared memory of the kernels (set as the functions' limit at setup).
constexpr size_t kDispatchSmem = size_t(kThreads / 32) * kStages * (128 * 16 + 96 * 4);
constexpr int kMinPushWarps = Tuning::kMinPushWarps;  // the fewest push warps (most sum warps)
constexpr size_t combine_smem(int push_warps) { return size_t(kThreads / 32 - push_warps) * kStages * (2 * 128 * 16 + 16); }
constexpr size_t kCombineSmem = combine_smem(kMinPushWarps);  // the function's limit


__device__ __forceinline__ uint64_t ld_acquire_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_sys(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void red_release_sys(uint64_t* p, uint64_t v) {
  asm volatile("red.release.sys.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ uint64_t ld_acquire_gpu(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void red_release_gpu(uint64_t* p, uint64_t v) {
  asm volatile("red.release.gpu.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ uint64_t now_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ inline void record_timeout(const Args& a, int rank, int where) {
  volatile ErrorRecord* e = a.err;
  if (atomicCAS(&a.S->abort, 0, 1) == 0) {
    e->rank = rank;
    e->where = where;
    __threadfence_system();
    e->code = kErrTimeout;
    __threadfence_system();
  }
}

// Spins until *p >= target (system scope). False after a timeout (recorded, naming `rank`) or
// when another wait of this rank already timed out.
__device__ inline bool wait_sys(const Args& a, const uint64_t* p, uint64_t target, int rank, int where) {
  const uint64_t t0 = now_ns();
  uint32_t spins = 0;
  while (ld_acquire_sys(p) < target) {
    if ((++spins & 255u) == 0) {
      if (*reinterpret_cast<volatile int32_t*>(&a.S->abort)) return false;
      if (int64_t(now_ns() - t0) > a.timeout_ns) {
        record_timeout(a, rank, where);
        return false;
      }
    }
  }
  return true;
}

// wait_sys for one lane among many: polls with a short sleep so that spinning warps leave issue
// slots to the warps that move data on the same SM.
__device__ inline bool wait_flag(const Args& a, const uint64_t* p, uint64_t target, int rank, int where) {
  if (ld_acquire_sys(p) >= target) return true;
  const uint64_t t0 = now_ns();
  uint32_t spins = 0;
  while (ld_acquire_sys(p) < target) {
    __nanosleep(64);
    if ((++spins & 63u) == 0) {
      if (*reinterpret_cast<volatile int32_t*>(&a.S->abort)) return false;
      if (int64_t(now_ns() - t0) > a.timeout_ns) {
        record_timeout(a, rank, where);
        return false;
      }
    }
  }
  return true;
}

// All CTAs of this grid (co-resident by construction: gridDim.x <= SMs, one CTA per SM).
__device__ inline void grid_sync(const Args& a, uint64_t target) {
  __syncthreads();
  if (threadIdx.x == 0) {
    red_release_gpu(&a.S->grid_bar, 1);
    const uint64_t t0 = now_ns();
    uint32_t spins = 0;
    while (ld_acquire_gpu(&a.S->grid_bar) < target) {
      if ((++spins & 255u) == 0) {
        if (*reinterpret_cast<volatile int32_t*>(&a.S->abort)) break;
        if (int64_t(now_ns() - t0) > a.timeout_ns) {
          record_timeout(a, a.me, kAtGridBarrier);
          break;
        }
      }
    }
  }
  __syncthreads();
}

}  // namespace epmoe::nvl
