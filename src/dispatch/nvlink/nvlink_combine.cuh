// Device side of the "nvlink" combine: push warps send y rows (bf16, or fp8-encoded) into the home
// rank's window and release a per-row flag; sum warps add a token's partials in ascending rank order
// (fp32, no fma) as soon as their flags are set.
#pragma once
#include "dispatch/nvlink/nvlink_kernels.cuh"

namespace epmoe::nvl {

// Combine, bf16 rows: the row (H bf16) copied with 16-byte loads 8 deep per lane and 16-byte stores
// contiguous across the warp.
__device__ __forceinline__ void copy_row_bf16(const bf16_raw* src, uint8_t* dst, int H) {
  const int lane = threadIdx.x & 31;
  const int nch = H >> 3;
  const uint4* s = reinterpret_cast<const uint4*>(src);
  uint4* d = reinterpret_cast<uint4*>(dst);
  constexpr int kDepth = 8;
  uint4 cur[kDepth];
#pragma unroll
  for (int i = 0; i < kDepth; ++i) {
    const int c = 32 * i + lane;
    cur[i] = c < nch ? __ldg(s + c) : a2a::zero4();
  }
  for (int base = 0; base < nch; base += 32 * kDepth) {
    uint4 nxt[kDepth];
#pragma unroll
    for (int i = 0; i < kDepth; ++i) {
      const int c = base + 32 * (kDepth + i) + lane;
      nxt[i] = c < nch ? __ldg(s + c) : a2a::zero4();
    }
#pragma unroll
    for (int i = 0; i < kDepth; ++i) {
      const int c = base + 32 * i + lane;
      if (c < nch) d[c] = cur[i];
    }
#pragma unroll
    for (int i = 0; i < kDepth; ++i) cur[i] = nxt[i];
  }
}

// One pushed row: valid row i (of `total`, regions in the order me+1, me+2, ...) goes to its home
// rank's region [me] at the same slot. Returns the row's flag in the home window.
// R, me: a.R, a.me; ps, ss: the combine format's payload and scale bytes per row (read once by the
// caller).
template <ActFormat CF>
__device__ __forceinline__ uint64_t* push_row(const Args& a, int64_t i, int R, int me, size_t ps, size_t ss) {
  int64_t j = i;
  int s = 0;
  for (int k = 0; k < R; ++k) {
    s = (me + 1 + k) % R;
    if (CF == ActFormat::bf16 && s == me) continue;
    const int n = a.S->counts[s];
    if (j < n) break;
    j -= n;
  }
  const bf16_raw* src = a.y + (size_t(s) * a.C + j) * a.H;
  uint8_t* home = a.peer_base[s];
  const size_t row = size_t(me) * a.C + j;
  if constexpr (CF == ActFormat::bf16) {
    copy_row_bf16(src, home + a.L.cpayload + row * ps, a.H);
  } else {
    uint8_t* prow = home + a.L.cpayload + row * ps;
    uint8_t* srow = home + a.L.cscales + row * ss;
    const int P = a2a::units_per_row(a.H);
    a2a::UnitRaw cur;
    a2a::unit_load<CF>(src, a.H, 0, cur);
    for (int p = 0; p < P; ++p) {
      a2a::UnitRaw nxt;
      if (p + 1 < P) a2a::unit_load<CF>(src, a.H, (p + 1) * a2a::kUnitElems, nxt);
      a2a::UnitEnc enc;
      a2a::unit_encode<CF>(cur, a.q, enc);
      a2a::unit_store<CF>(cur, enc, a.H, p * a2a::kUnitElems, prow, srow);
      cur = nxt;
    }
  }
  return reinterpret_cast<uint64_t*>(home + a.L.cflag) + row;
}

// Combine push (warps [0, a.push_warps) of every CTA): one warp per valid slot row; the row goes to
// its home rank's region [me] at the same slot, then the warp releases the row's flag with the
// combine epoch. bf16: rows of this rank's own tokens stay where they are (the sum reads y).
// (One system-scope fence per 4 rows instead of a release per row was measured slower: bf16
// combine at 4096 tokens 314 -> 343 us, bench/results/history-comm.md; removed.)
template <ActFormat CF>
__device__ void combine_push(const Args& a, uint64_t e) {
  const int R = a.R, me = a.me, lane = threadIdx.x & 31;
  const int64_t gw = int64_t(blockIdx.x) * a.push_warps + (threadIdx.x >> 5);
  const int64_t nw = int64_t(gridDim.x) * a.push_warps;
  const size_t ps = payload_bytes(CF, a.H), ss = scale_bytes(CF, a.H);
  // Regions in the order me+1, me+2, ... so that different senders feed different homes first.
  int64_t total = 0;
  for (int k = 0; k < R; ++k) {
    const int s = (me + 1 + k) % R;
    if (CF == ActFormat::bf16 && s == me) continue;
    total += a.S->counts[s];
  }
  for (int64_t i = gw; i < total; i += nw) {
    uint64_t* flag = push_row<CF>(a, i, R, me, ps, ss);
    __syncwarp();  // the whole warp's stores are ordered before lane 0's release
    if (lane == 0) st_release_sys(flag, e);
  }
}

// Combine sum (the other warps): one warp per token (or per part of a token when tokens are fewer
// than warps); partials in ascending rank, fp32 from +0, no fma; loads of the next 1024 elements are
// in flight while the current ones are added.
template <ActFormat CF>
__device__ void combine_sum(const Args& a, uint64_t e) {
  const int R = a.R, me = a.me, lane = threadIdx.x & 31;
  const int nsw = kThreads / 32 - a.push_warps;
  const int64_t gw = int64_t(blockIdx.x) * nsw + (threadIdx.x >> 5) - a.push_warps;
  const int64_t nw = int64_t(gridDim.x) * nsw;
  const size_t ps = payload_bytes(CF, a.H), ss = scale_bytes(CF, a.H);
  const uint8_t* mine = a.peer_base[me];
  const int P = a2a::units_per_row(a.H);
  int parts = 1, lp = 0;  // few tokens: split rows so that more warps work (parts = 2^lp)
  while (parts * 2 <= P && a.T * parts * 2 <= nw) parts *= 2, ++lp;
  for (int64_t w = gw; w < a.T * parts; w += nw) {
    const int64_t t = w >> lp;
    const int part = int(w & (parts - 1));
    const int u0 = part * P / parts, u1 = (part + 1) * P / parts;
    const int j = lane < R ? a.slot_map[t * R + lane] : -1;
    const uint8_t* prow = nullptr;
    const uint8_t* srow = nullptr;
    bool ok = true;
    if (j >= 0) {
      if (CF == ActFormat::bf16 && lane == me) {
        prow = reinterpret_cast<const uint8_t*>(a.y + (size_t(me) * a.C + j) * a.H);
      } else {
        const size_t row = size_t(lane) * a.C + j;
        prow = mine + a.L.cpayload + row * ps;
        srow = ss ? mine + a.L.cscales + row * ss : nullptr;
        ok = wait_flag(a, reinterpret_cast<const uint64_t*>(mine + a.L.cflag) + combine_flag_row(a, lane, j), e, lane,
                       kAtCombineData);
      }
    }
    const uint32_t mask = __ballot_sync(0xffffffffu, j >= 0);
    const bool all_ok = __all_sync(0xffffffffu, ok);
    __syncwarp();  // orders the waiting lanes' acquires before every lane's reads
    bf16_raw* orow = a.out + size_t(t) * a.H;
    const uint32_t m_all = all_ok ? mask : 0u;
    if (__popc(m_all) <= 2) {
      // At most two partials (always with R = 2): the next unit's loads are issued before the
      // current unit is added and stored.
      const int d0 = m_all ? __ffs(m_all) - 1 : 0;
      const uint32_t rest = m_all & (m_all - 1);
      const int d1 = rest ? __ffs(rest) - 1 : 0;
      const int n = __popc(m_all);
      const uint8_t* p0 = reinterpret_cast<const uint8_t*>(__shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(prow), d0));
      const uint8_t* s0 = reinterpret_cast<const uint8_t*>(__shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(srow), d0));
      const uint8_t* p1 = reinterpret_cast<const uint8_t*>(__shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(prow), d1));
      const uint8_t* s1 = reinterpret_cast<const uint8_t*>(__shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(srow), d1));
      uint4 v0[4], v1[4];
      float c0[4], c1[4];
      if (n > 0) a2a::sum_load<CF>(p0, s0, a.H, u0 * a2a::kUnitElems, v0, c0);
      if (n > 1) a2a::sum_load<CF>(p1, s1, a.H, u0 * a2a::kUnitElems, v1, c1);
      for (int uu = u0; uu < u1; ++uu) {
        uint4 w0[4], w1[4];
        float g0[4], g1[4];
        const int en = (uu + 1) * a2a::kUnitElems;
        if (uu + 1 < u1 && n > 0) a2a::sum_load<CF>(p0, s0, a.H, en, w0, g0);
        if (uu + 1 < u1 && n > 1) a2a::sum_load<CF>(p1, s1, a.H, en, w1, g1);
        const int nch = a.H >> 3;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int c = uu * (a2a::kUnitElems / 8) + 32 * i + lane;
          if (c < nch) reinterpret_cast<uint4*>(orow)[c] = a2a::sum_chunk2<CF>(n, v0[i], c0[i], v1[i], c1[i]);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          v0[i] = w0[i];
          v1[i] = w1[i];
          c0[i] = g0[i];
          c1[i] = g1[i];
        }
      }
      continue;
    }
    for (int uu = u0; uu < u1; ++uu) {
      const int e0 = uu * a2a::kUnitElems;
      float acc[4][8];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int k = 0; k < 8; ++k) acc[i][k] = 0.f;
      uint32_t m = m_all;
      while (m) {  // three or more partials (R > 2): one partial's 4 chunks at a time, ascending rank
        const int d = __ffs(m) - 1;
        m &= m - 1;
        const uint8_t* pd = reinterpret_cast<const uint8_t*>(__shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(prow), d));
        const uint8_t* sd = reinterpret_cast<const uint8_t*>(__shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(srow), d));
        uint4 v[4];
        float c[4];
        a2a::sum_load<CF>(pd, sd, a.H, e0, v, c);
        a2a::sum_add<CF>(acc, v, c);
      }
      a2a::sum_store(acc, a.H, e0, orow);
    }
  }
}

// combine_sum for R = 2 and bf16 rows (at most two partials per token): a warp streams its
// (token, unit) steps through kStages shared-memory stages filled by cp.async, so ~3 units (12 KB)
// per warp are in flight instead of one. The step kStages-1 ahead is issued before the current one is
// summed; entering a new token, the issuing side first acquires the flag of its remote row.
__device__ inline void combine_sum_r2_bf16(const Args& a, uint64_t e) {
  const int me = a.me, lane = threadIdx.x & 31;
  const int sw = (threadIdx.x >> 5) - a.push_warps;
  const int nsw = kThreads / 32 - a.push_warps;
  const int64_t gw = int64_t(blockIdx.x) * nsw + sw;
  const int64_t nw = int64_t(gridDim.x) * nsw;
  const size_t ps = payload_bytes(ActFormat::bf16, a.H);
  const uint8_t* mine = a.peer_base[me];
  const int P = a2a::units_per_row(a.H), nch = a.H >> 3;
  // parts = 2^lp assignments per token; shifts instead of 64-bit divisions by it (per-step index
  // arithmetic was a visible share of the instructions: bench/results/history-comm.md).
  int parts = 1, lp = 0;
  while (parts * 2 <= P && a.T * parts * 2 <= nw) parts *= 2, ++lp;
  const int64_t nassign = a.T * parts;
  extern __shared__ uint4 dyn[];
  uint4* ring = dyn + size_t(sw) * kStages * 256;  // [stage][partial][chunk i][lane]
  int32_t* meta = reinterpret_cast<int32_t*>(dyn + size_t(nsw) * kStages * 256) + size_t(sw) * kStages * 4;

  // Issuing side: assignment w (token t, units [u0, u1)), its partial rows p0, p1 (n valid).
  int64_t iw = gw, it = 0;  // assignment and its token
  int iu = 0, iu1 = 0, n = 0;
  const uint8_t* p0 = nullptr;
  const uint8_t* p1 = nullptr;
  auto enter = [&]() {  // iw < nassign: acquire the token's rows
    const int64_t t = iw >> lp;
    const int part = int(iw & (parts - 1));
    it = t;
    iu = part * P / parts;
    iu1 = (part + 1) * P / parts;
    const int j = lane < 2 ? a.slot_map[t * 2 + lane] : -1;
    const uint8_t* prow = nullptr;
    bool ok = true;
    if (j >= 0) {
      if (lane == me) {
        prow = reinterpret_cast<const uint8_t*>(a.y + (size_t(me) * a.C + j) * a.H);
      } else {
        const size_t row = size_t(lane) * a.C + j;
        prow = mine + a.L.cpayload + row * ps;
        ok = wait_flag(a, reinterpret_cast<const uint64_t*>(mine + a.L.cflag) + combine_flag_row(a, lane, j), e, lane,
                       kAtCombineData);
      }
    }
    const uint32_t mask = __ballot_sync(0xffffffffu, j >= 0);
    const bool all_ok = __all_sync(0xffffffffu, ok);
    __syncwarp();  // orders the waiting lanes' acquires before every lane's copies
    const uint32_t m = all_ok ? mask : 0u;
    n = __popc(m);
    const int d0 = m ? __ffs(m) - 1 : 0;
    const int d1 = (m & (m - 1)) ? __ffs(m & (m - 1)) - 1 : 0;
    p0 = reinterpret_cast<const uint8_t*>(__shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(prow), d0));
    p1 = reinterpret_cast<const uint8_t*>(__shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(prow), d1));
  };
  if (iw < nassign) enter();
  auto issue = [&](int stage) {  // the step at (iw, iu), then advance
    if (iw >= nassign) return;
    uint4* st = ring + stage * 256;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int c = iu * (a2a::kUnitElems / 8) + 32 * i + lane;
      const bool on = c < nch;
      if (n > 0) a2a::cp_async16(st + i * 32 + lane, on ? p0 + 16 * size_t(c) : p0, on ? 16 : 0);
      if (n > 1) a2a::cp_async16(st + 128 + i * 32 + lane, on ? p1 + 16 * size_t(c) : p1, on ? 16 : 0);
    }
    if (lane == 0) {
      int32_t* m = meta + stage * 4;
      m[0] = int32_t(it);  // T <= C < 2^31
      m[1] = iu;
      m[2] = n;
    }
    if (++iu >= iu1) {
      iw += nw;
      if (iw < nassign) enter();
    }
  };
  // Summing side: the same sequence, kStages-1 steps behind.
  int64_t nsteps = 0;
  for (int64_t w = gw; w < nassign; w += nw) {
    const int part = int(w & (parts - 1));
    nsteps += (part + 1) * P / parts - part * P / parts;
  }
#pragma unroll
  for (int k = 0; k < kStages - 1; ++k) {
    issue(k);
    a2a::cp_async_commit();
  }
  for (int64_t k = 0; k < nsteps; ++k) {
    issue(int((k + kStages - 1) % kStages));
    a2a::cp_async_commit();
    a2a::cp_async_wait<kStages - 1>();
    __syncwarp();  // lane 0's meta of this stage
    const int stage = int(k % kStages);
    const int32_t* m = meta + stage * 4;
    const int64_t t = m[0];
    const int uu = m[1], nn = m[2];
    const uint4* st = ring + stage * 256;
    bf16_raw* orow = a.out + size_t(t) * a.H;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int c = uu * (a2a::kUnitElems / 8) + 32 * i + lane;
      if (c < nch) {
        const uint4 v0 = nn > 0 ? st[i * 32 + lane] : a2a::zero4();
        const uint4 v1 = nn > 1 ? st[128 + i * 32 + lane] : a2a::zero4();
        reinterpret_cast<uint4*>(orow)[c] = a2a::sum_chunk2<ActFormat::bf16>(nn, v0, 0.f, v1, 0.f);
      }
    }
    __syncwarp();  // every lane read the meta before lane 0 rewrites this stage's
  }
  a2a::cp_async_wait_all();
}

template <ActFormat CF>
__global__ void __launch_bounds__(kThreads, 1) combine_kernel(Args a) {
  // The epoch of this combine's rows: dispatches that succeeded so far (a rejected dispatch has a
  // combine that moves nothing, on every rank alike).
  const uint64_t e = *reinterpret_cast<volatile uint64_t*>(&a.S->combines);
  const bool failed = *reinterpret_cast<volatile int32_t*>(&a.S->failed) != 0;
  if (failed) {  // nothing was dispatched: zeros, no traffic
    const int64_t n = a.T * (a.H / 8);
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
      reinterpret_cast<uint4*>(a.out)[i] = a2a::zero4();
    return;
  }
  trace_point(a, detail::kTrCombineStart);
  trace_span(a, detail::kTrCombineFirst, detail::kTrCombineLastStartInv);
  if ((threadIdx.x >> 5) < a.push_warps) {
    if (a.ce_rows == 0) combine_push<CF>(a, e);  // else the copy engine moves the rows
    trace_point(a, detail::kTrCombinePushed);  // warp 0's rows (thread 0 is a push lane)
  } else if (CF == ActFormat::bf16 && a.R == 2) {
    combine_sum_r2_bf16(a, e);
  } else {
    combine_sum<CF>(a, e);
  }
  if (a.trace) __syncthreads();  // uniform: every CTA traces or none
  trace_point(a, detail::kTrCombineEnd);
  trace_span(a, detail::kTrCombineFirstEnd, detail::kTrCombineLastInv);
}

}  // namespace epmoe::nvl
