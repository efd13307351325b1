// The "nvlink" dispatcher: device-initiated one-sided push over NCCL symmetric memory (LSA peer
// pointers into windows registered with NCCL_WIN_DEFAULT; no multicast anywhere).
//
// One dispatch is one kernel of cfg.tuning.comm_sms CTAs (call epoch e, kept in device memory):
//   1. each CTA validates and counts its chunk of tokens per destination; grid barrier (the only one);
//   2. CTA 0 writes a Status {count, input problem, grid size} into every peer's window and releases
//      it with epoch e. A peer's status for e doubles as its ack that it finished with call e-1's
//      receive buffers. Any problem anywhere: nothing moves, every rank records the same UsageError;
//   3. before the statuses are in: slots by prefix sums (chunk counts + warp ballots, no atomics)
//      and the loads of each warp's first unit, so that the status round trip hides them;
//   4. every CTA acquires all statuses; then warps take units (token, 1024 elements), quantize each
//      once (hardware e4m3 conversion; e2m1 branch-free) and store it with 16-byte stores into every
//      destination's region [me][slot]; each warp keeps its next kStages-1 units' loads in flight
//      through a cp.async ring in shared memory (the first ones issued before the status wait);
//   5. every CTA adds 1 (release, system scope) to each peer's arrival counter for this source and
//      waits (acquire) until every source's counter reached the sum of the grid sizes it announced;
//      then each CTA resets a share of the ids that became invalid and counts a share of experts.
// Combine: in every CTA, cfg.tuning.push_warps (6) warps push valid y rows (bf16, or fp8-encoded) to the home
// rank's region [me][slot] and release a per-row flag with the combine epoch; the other warps sum
// tokens as soon as the flags of their rows are set (ascending rank, fp32, no fma), so the sum
// overlaps the transfer; with R = 2 and bf16 rows the sum streams through a cp.async ring too.
// bf16: a rank's own rows are read from y in place, never copied. Opt-in (cfg.tuning.combine = ce,
// bf16 rows): the copy engine moves whole regions of y instead, with a flag per copy (copy_rows).
// No host synchronisation; CUDA-graph capturable (epochs and counters live in device memory).
// Waits are bounded: a peer that never arrives leaves an error record naming it, and the host
// raises TimeoutError at its next call (or at gpu_dispatcher_sync).
#include <nccl.h>
#include <nccl_device.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>
#include <string>
#include <vector>

#include "core/cuda/check.h"
#include "comm/nccl/nccl_comm_impl.h"
#include "dispatch/a2a/host.h"
#include "dispatch/check.h"
#include "dispatch/nvlink/grid.h"
#include "dispatch/output.h"
#include "dispatch/nvlink/nvlink_combine.cuh"
#include "dispatch/nvlink/nvlink_kernels.cuh"
#include "epmoe/error.h"

namespace epmoe::detail {

namespace {

using namespace epmoe::nvl;

__global__ void peer_bases_kernel(ncclWindow_t win, int R, int me, uint8_t* local, uint8_t** out) {
  const int d = threadIdx.x;
  if (d < R) out[d] = d == me ? local : static_cast<uint8_t*>(ncclGetLsaPointer(win, 0, d));
}

// Phase 1 of the id reset and expert counts of a dispatch: region s slots [n, prev) get ids -1
// (runners read ids past counts[s] as -1) and expert_counts gets the (slot, k) pairs of the valid
// slots. Each CTA takes a share of every region (global thread stride).
__device__ inline void finish_regions(const Args& a, uint8_t* mine, const int* sm_n, int prev_parity, int* sm_hist) {
  const int R = a.R, K = a.K;
  const int64_t gt = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, gs = int64_t(gridDim.x) * blockDim.x;
  int32_t* ids = reinterpret_cast<int32_t*>(mine + a.L.ids);
  const bool hist = a.E_loc <= kHist;
  for (int i = threadIdx.x; hist && i < a.E_loc; i += blockDim.x) sm_hist[i] = 0;
  __syncthreads();
  for (int s = 0; s < R; ++s) {
    const int n = sm_n[s], prev = a.S->prev_n[prev_parity][s];
    int32_t* reg = ids + size_t(s) * a.C * K;
    for (int64_t i = int64_t(n) * K + gt; i < int64_t(prev) * K; i += gs) reg[i] = -1;
    for (int64_t i = gt; i < int64_t(n) * K; i += gs) {
      const int id = reg[i];
      if (id >= 0 && id < a.E_loc) {
        if (hist) atomicAdd(&sm_hist[id], 1);
        else atomicAdd(&a.expert_counts[id], 1);
      }
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; hist && i < a.E_loc; i += blockDim.x)
    if (sm_hist[i]) atomicAdd(&a.expert_counts[i], sm_hist[i]);
}

template <ActFormat F>
__global__ void __launch_bounds__(kThreads, 1) dispatch_kernel(Args a) {
  __shared__ int sm_counts[a2a::kMaxRanks], sm_prefix[a2a::kMaxRanks], sm_running[a2a::kMaxRanks];
  __shared__ int32_t sm_total[a2a::kMaxRanks];
  __shared__ int sm_warp[(kThreads / 32) * a2a::kMaxRanks];
  __shared__ a2a::DestRegion sm_dst[a2a::kMaxRanks];
  __shared__ int sm_n[a2a::kMaxRanks];
  __shared__ uint64_t sm_target[a2a::kMaxRanks];
  __shared__ int sm_hist[kHist];
  __shared__ int sm_bad_any, sm_my_bad;
  __shared__ uint64_t sm_epoch;
  const int R = a.R, me = a.me, G = gridDim.x, b = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  trace_span(a, detail::kTrDispatchFirst, detail::kTrDispatchLastStartInv);
  if (threadIdx.x == 0) {
    sm_epoch = *reinterpret_cast<volatile uint64_t*>(&a.S->epoch);
    sm_bad_any = 0;
  }
  __syncthreads();
  trace_point(a, detail::kTrDispatchStart);
  const uint64_t e = sm_epoch;
  const int64_t chunk = a.T > 0 ? (a.T + G - 1) / G : 0;
  const int64_t t0 = min(a.T, b * chunk), t1 = min(a.T, t0 + chunk);

  // 1. Count (and validate) this CTA's chunk; the grid barrier publishes chunk counts and a.S->bad.
  if (a.local_code == kOk) {
    a2a::count_chunk(a.p, a.ids, a.K, me, t0, t1, a.chunk_counts + size_t(b) * R, &a.S->bad, sm_counts);
  } else if (threadIdx.x < R) {
    a.chunk_counts[size_t(b) * R + threadIdx.x] = 0;
  }
  if (b == 0)
    for (int i = threadIdx.x; i < a.E_loc; i += blockDim.x) a.expert_counts[i] = 0;
  trace_point(a, detail::kTrChunkCounted);
  grid_sync(a, e * G);  // one barrier per dispatch: target e*G
  trace_point(a, detail::kTrCounted);

  // Per destination d (warp d % nwarps): the counts of this source's chunks before ours (our slots'
  // base) and of all its chunks (CTA 0's status), each lane adding every 32nd chunk and the warp
  // reducing, so a CTA waits for one load round trip instead of up to G dependent additions.
  for (int d = warp; d < R; d += nwarps) {
    int32_t pre = 0, tot = 0;
    for (int c = lane; c < G; c += 32) {
      const int32_t v = a.chunk_counts[size_t(c) * R + d];
      tot += v;
      if (c < b) pre += v;
    }
    pre = __reduce_add_sync(0xffffffffu, pre);
    tot = __reduce_add_sync(0xffffffffu, tot);
    if (lane == 0) {
      sm_prefix[d] = pre;
      sm_total[d] = tot;
    }
  }
  __syncthreads();

  // 2. Our status to every peer (CTA 0).
  if (threadIdx.x == 0)
    sm_my_bad = a.local_code != kOk || *reinterpret_cast<volatile int32_t*>(&a.S->bad) != INT_MAX;
  if (b == 0 && threadIdx.x < R) {
    const int d = threadIdx.x;
    const int32_t total = sm_total[d];
    int32_t code = a.local_code, bt = 0, bk = 0, bid = a.local_value;
    const int32_t bad = *reinterpret_cast<volatile int32_t*>(&a.S->bad);
    if (code == kOk && bad != INT_MAX) {
      code = kBadId;
      bt = bad / a.K;
      bk = bad % a.K;
      bid = a.ids[bad];
    }
    Status* st = reinterpret_cast<Status*>(a.peer_base[d] + a.L.status + size_t(me) * kStatusBytes);
    st->count = code == kOk ? total : 0;
    st->code = code;
    st->T = static_cast<int32_t>(a.T_in);
    st->bad_t = bt;
    st->bad_k = bk;
    st->bad_id = bid;
    st->grid = G;
    st_release_sys(&st->epoch, e);
  }
  __syncthreads();
  trace_point(a, detail::kTrStatusSent);
  const bool my_bad = sm_my_bad != 0;

  // 3. Before the statuses arrive: slots of this chunk (local work only) and the first unit's loads,
  //    so that the status round trip hides them.
  const int P = a2a::units_per_row(a.H);
  const int64_t nunits = my_bad ? 0 : (t1 - t0) * P;
  const size_t ps = payload_bytes(F, a.H), ss = scale_bytes(F, a.H);
  if (!my_bad && t1 > t0) {
    for (int d = threadIdx.x; d < R; d += blockDim.x) {
      const size_t base = size_t(me) * a.C;
      uint8_t* w = a.peer_base[d];
      sm_dst[d] = a2a::DestRegion{w + a.L.payload + base * ps, ss ? w + a.L.scales + base * ss : nullptr,
                                  reinterpret_cast<int32_t*>(w + a.L.ids) + base * a.K,
                                  reinterpret_cast<float*>(w + a.L.weights) + base * a.K};
    }
    __syncthreads();
    a2a::slot_chunk(a.p, a.ids, a.K, me, t0, t1, sm_prefix, a.slot_map, sm_warp, sm_running);
    __syncthreads();  // slot_map of this chunk was written by other threads of the CTA
  }
  // Each warp streams its units through a ring of kStages shared-memory stages (cp.async): the
  // unit's bf16 input (2 KB) and, per lane, the token's slot on destination `lane` and, for the
  // token's first unit, its routing row entry `lane`. The first kStages-1 units are issued here, so
  // their loads travel while the statuses do.
  extern __shared__ uint4 dyn[];
  uint4* ring = dyn + size_t(warp) * kStages * 128;
  int32_t* meta = reinterpret_cast<int32_t*>(dyn + size_t(nwarps) * kStages * 128) + size_t(warp) * kStages * 96;
  // Unit v of this CTA's chunk is (token t0 + v / P, piece v % P). A warp visits units warp, warp +
  // nwarps, ...; both of its walks (loads issued kStages-1 ahead, units consumed) keep (token,
  // piece) as a cursor advanced by nwarps = dq * P + dr units, so no step divides (ncu: the two
  // 64-bit divisions per unit were ~60 of its ~550 instructions; bench/results/history-comm.md).
  struct UnitCursor {
    int64_t t;
    int piece;
  };
  const int dq = nwarps / P, dr = nwarps % P;
  auto advance = [&](UnitCursor& c) {
    c.t += dq;
    c.piece += dr;
    if (c.piece >= P) {
      c.piece -= P;
      ++c.t;
    }
  };
  auto issue = [&](const UnitCursor& c, int stage) {
    const int64_t t = c.t;
    const int piece = c.piece;
    a2a::unit_load_async<F>(a.hidden + size_t(t) * a.H, a.H, piece * a2a::kUnitElems, ring + stage * 128);
    int32_t* m = meta + stage * 96;
    a2a::cp_async4(m + lane, a.slot_map + t * R + min(lane, R - 1), lane < R ? 4 : 0);
    const bool rk = piece == 0 && lane < a.K;
    a2a::cp_async4(m + 32 + lane, a.ids + t * a.K + min(lane, a.K - 1), rk ? 4 : 0);
    a2a::cp_async4(m + 64 + lane, a.w + t * a.K + min(lane, a.K - 1), rk ? 4 : 0);
  };
  int64_t issue_v = warp;
  UnitCursor ic{t0 + warp / P, warp % P};
#pragma unroll
  for (int k = 0; k < kStages - 1; ++k) {
    if (issue_v < nunits) issue(ic, k);
    a2a::cp_async_commit();
    issue_v += nwarps;
    advance(ic);
  }

  trace_point(a, detail::kTrSlotsDone);
  // 4. Everyone's status (thread s < R watches source s).
  uint8_t* mine = a.peer_base[me];
  if (threadIdx.x < R) {
    const int s = threadIdx.x;
    const Status* st = reinterpret_cast<const Status*>(mine + a.L.status + size_t(s) * kStatusBytes);
    sm_n[s] = 0;
    sm_target[s] = 0;
    if (wait_sys(a, &st->epoch, e, s, kAtStatus)) {
      const int32_t code = *reinterpret_cast<const volatile int32_t*>(&st->code);
      sm_n[s] = *reinterpret_cast<const volatile int32_t*>(&st->count);
      sm_target[s] = a.S->arrivals[s] + uint64_t(*reinterpret_cast<const volatile int32_t*>(&st->grid));
      if (code != kOk) atomicOr(&sm_bad_any, 1);
      if (b == 0 && code != kOk) {  // only problems cross PCIe into the host-mapped record
        volatile int32_t* rec = a.err->bad[s];
        rec[kRecCode] = code;
        rec[kRecTokens] = *reinterpret_cast<const volatile int32_t*>(&st->T);
        rec[kRecToken] = *reinterpret_cast<const volatile int32_t*>(&st->bad_t);
        rec[kRecK] = *reinterpret_cast<const volatile int32_t*>(&st->bad_k);
        rec[kRecValue] = *reinterpret_cast<const volatile int32_t*>(&st->bad_id);
      }
    } else {
      atomicOr(&sm_bad_any, 2);
    }
  }
  __syncthreads();
  trace_point(a, detail::kTrStatuses);
  const int bad_any = sm_bad_any;

  // 5. Push: a warp takes units (token, 1024 elements), quantizes each once and stores it to every
  //    destination of the token; the loads of its next kStages-1 units are in flight meanwhile.
  if (bad_any == 0) {
    int stage = 0, refill = kStages - 1;  // ring stage of this unit, and of the unit kStages-1 ahead
    UnitCursor uc{t0 + warp / P, warp % P};
    for (int64_t u = warp; u < nunits; u += nwarps) {
      // Refill the stage consumed last iteration with the unit kStages-1 ahead, then wait for this one.
      if (issue_v < nunits) issue(ic, refill);
      a2a::cp_async_commit();
      issue_v += nwarps;
      advance(ic);
      a2a::cp_async_wait<kStages - 1>();
      const int64_t t = uc.t;
      const int piece = uc.piece, e0 = piece * a2a::kUnitElems;
      advance(uc);
      a2a::UnitRaw raw;
      a2a::unit_from_stage<F>(ring + stage * 128, raw);
      const int32_t* m = meta + stage * 96;
      if (++stage == kStages) stage = 0;
      if (++refill == kStages) refill = 0;
      const int myj = lane < R ? m[lane] : -1;
      a2a::UnitEnc enc;
      a2a::unit_encode<F>(raw, a.q, enc);
      int crank = -1, cslot = -1;
      float wk = 0.f;
      if (piece == 0 && lane < a.K) {
        const int eid = m[32 + lane];
        wk = __int_as_float(m[64 + lane]);
        if (eid >= 0) a2a::choose_copy(a.p, eid, me, t, crank, cslot);
      }
      uint32_t dmask = __ballot_sync(0xffffffffu, myj >= 0);
      while (dmask) {
        const int d = __ffs(dmask) - 1;
        dmask &= dmask - 1;
        const int j = __shfl_sync(0xffffffffu, myj, d);
        const a2a::DestRegion& dr = sm_dst[d];
        a2a::unit_store<F>(raw, enc, a.H, e0, dr.payload + size_t(j) * ps, ss ? dr.scales + size_t(j) * ss : nullptr);
        if (piece == 0 && lane < a.K) {  // the routing row, translated for this destination
          dr.ids[size_t(j) * a.K + lane] = crank == d ? cslot : -1;
          dr.weights[size_t(j) * a.K + lane] = wk;
        }
      }
    }
  }
  a2a::cp_async_wait_all();  // nothing may still be landing in shared memory when the CTA moves on

  // 6. Arrive everywhere (also when nothing moved, so that the counters stay in step), then every
  //    CTA waits for every source: no second grid barrier.
  __syncthreads();
  trace_point(a, detail::kTrPushed);
  if (threadIdx.x < R)
    red_release_sys(reinterpret_cast<uint64_t*>(a.peer_base[threadIdx.x] + a.L.arrive_d) + me, 1);
  if (threadIdx.x < R && sm_target[threadIdx.x] != 0) {
    const int s = threadIdx.x;
    if (!wait_sys(a, reinterpret_cast<const uint64_t*>(mine + a.L.arrive_d) + s, sm_target[s], s, kAtDispatchData))
      atomicOr(&sm_bad_any, 2);
  }
  __syncthreads();
  trace_point(a, detail::kTrArrived);
  if (threadIdx.x < R && sm_bad_any != 0) sm_n[threadIdx.x] = 0;
  __syncthreads();

  // 7. Ids of slots that became invalid, expert counts (every CTA a share).
  finish_regions(a, mine, sm_n, int((e - 1) & 1), sm_hist);
  if (b == 0) {
    if (threadIdx.x < R) {
      const int s = threadIdx.x;
      a.S->counts[s] = sm_n[s];
      a.S->prev_n[e & 1][s] = sm_n[s];
      a.S->arrivals[s] = sm_target[s];
    }
    if (threadIdx.x == 0) {
      const int bad_final = sm_bad_any;
      a.S->bad = INT_MAX;
      a.S->failed = bad_final != 0;
      if (bad_final == 0) a.S->combines += 1;
      if (bad_final & 1) {
        volatile ErrorRecord* er = a.err;
        __threadfence_system();
        if (er->code == kErrNone) er->code = kErrUsage;
        __threadfence_system();
      }
      a.S->epoch = e + 1;
    }
  }
  if (a.trace) __syncthreads();  // uniform: every CTA traces or none
  trace_point(a, detail::kTrDispatchEnd);
  trace_span(a, detail::kTrDispatchFirstEnd, detail::kTrDispatchLastInv);
}

size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

Layout make_layout(const MoeConfig& cfg) {
  const size_t R = cfg.num_ranks, C = cfg.capacity, H = cfg.hidden, K = cfg.top_k;
  const size_t slots = R * C;
  Layout L{};
  size_t o = 0;
  auto take = [&](size_t bytes) {
    const size_t at = o;
    o = align_up(o + bytes, 256);
    return at;
  };
  L.status = take(R * kStatusBytes);
  L.arrive_d = take(R * 8);
  L.payload = take(slots * payload_bytes(cfg.dispatch_format, int(H)));
  L.scales = take(slots * scale_bytes(cfg.dispatch_format, int(H)));
  L.ids = take(slots * K * 4);
  L.weights = take(slots * K * 4);
  L.cpayload = take(slots * payload_bytes(cfg.combine_format, int(H)));
  L.cscales = take(slots * scale_bytes(cfg.combine_format, int(H)));
  L.cflag = take(slots * 8);
  L.total = align_up(o, size_t(1) << 21);
  return L;
}

class NvlinkDispatcher final : public GpuA2aDispatcher {
 public:
  NvlinkDispatcher(const MoeConfig& cfg, Communicator& c)
      : cfg_(cfg), comm_(as_nccl(c, "dispatcher \"nvlink\"")), R_(cfg.num_ranks), me_(c.rank()) {
    const auto dev = comm_.activate();  // first: validate() checks comm_sms against this device
    check_gpu_a2a_config(cfg, c.size(), c.rank(), "dispatcher \"nvlink\"");
    // Before any collective allocation: ranks built differently must fail here, not hang. The
    // fingerprint covers the combine mode and ce_rows ([agree]): both sides of a combine must agree
    // on who writes which flags.
    comm_.check_same(config_fingerprint(cfg), "dispatcher \"nvlink\" configuration (config_fingerprint)");
    int sms = 0;
    EPMOE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, comm_.device_index()));
    G_ = nvlink::comm_grid(cfg.tuning.comm_sms, sms);
    push_warps_ = cfg.tuning.push_warps;
    // Copy-engine combine (bf16 rows only: fp8 rows are encoded by the push warps on the way).
    if (cfg.tuning.combine == CombineMode::ce && cfg.combine_format == ActFormat::bf16) {
      ce_rows_ = std::min(cfg.tuning.ce_rows, std::max(1, cfg.capacity));
      push_warps_ = kMinPushWarps;  // idle: the copy engine moves the rows, the other warps sum
    }
    // The kernels stage loads in dynamic shared memory beyond the default 48 KB.
    EPMOE_CUDA_CHECK(cudaFuncSetAttribute(dispatch_kernel<ActFormat::bf16>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, int(kDispatchSmem)));
    EPMOE_CUDA_CHECK(cudaFuncSetAttribute(dispatch_kernel<ActFormat::fp8>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, int(kDispatchSmem)));
    EPMOE_CUDA_CHECK(cudaFuncSetAttribute(dispatch_kernel<ActFormat::nvfp4>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, int(kDispatchSmem)));
    EPMOE_CUDA_CHECK(cudaFuncSetAttribute(combine_kernel<ActFormat::bf16>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, int(kCombineSmem)));
    placement_ = std::make_unique<DevicePlacement>(cfg);
    L_ = make_layout(cfg);

    // Symmetric window: same size and registration order on every rank.
    EPMOE_NCCL_CHECK(ncclMemAlloc(&window_mem_, L_.total));
    EPMOE_CUDA_CHECK(cudaMemset(window_mem_, 0, L_.total));
    EPMOE_CUDA_CHECK(cudaMemset(static_cast<uint8_t*>(window_mem_) + L_.ids, 0xff,
                                size_t(R_) * cfg.capacity * cfg.top_k * 4));
    EPMOE_CUDA_CHECK(cudaDeviceSynchronize());
    EPMOE_NCCL_CHECK(ncclCommWindowRegister(comm_.handle(), window_mem_, L_.total, &win_, NCCL_WIN_DEFAULT));
    ncclDevCommRequirements reqs;
    std::memset(&reqs, 0, sizeof reqs);  // 2.28: no initializer macro; lsaMultimem stays false
    reqs.lsaBarrierCount = 1;
    const ncclResult_t dr = ncclDevCommCreate(comm_.handle(), &reqs, &dev_comm_);
    if (dr != ncclSuccess) {
      ncclCommWindowDeregister(comm_.handle(), win_);
      ncclMemFree(window_mem_);
      throw BackendError(std::string("dispatcher \"nvlink\": ncclDevCommCreate failed (") + ncclGetErrorString(dr) +
                         "): the GPUs need CUDA P2P between all ranks and cuMem (NCCL_CUMEM_ENABLE=1); use the "
                         "\"nccl\" dispatcher otherwise");
    }
    have_dev_comm_ = true;
    if (dev_comm_.lsaSize != R_ || dev_comm_.lsaRank != me_)
      throw UsageError("dispatcher \"nvlink\": ranks span several NVLink domains (lsaSize=" +
                       std::to_string(dev_comm_.lsaSize) + ", nRanks=" + std::to_string(R_) +
                       "); use the \"nccl\" dispatcher across nodes");

    peer_base_.reserve(size_t(R_) * sizeof(void*));
    peer_bases_kernel<<<1, 32>>>(win_, R_, me_, static_cast<uint8_t*>(window_mem_), peer_base_.get<uint8_t*>());
    EPMOE_CUDA_CHECK_LAUNCH();
    state_.reserve(sizeof(State));
    State s0{};
    s0.epoch = 1;
    s0.bad = INT_MAX;
    EPMOE_CUDA_CHECK(cudaMemcpy(state_.get(), &s0, sizeof s0, cudaMemcpyHostToDevice));
    chunk_counts_.reserve(size_t(G_) * R_ * 4);
    slot_map_.reserve(size_t(cfg.capacity) * R_ * 4);
    expert_counts_.reserve(std::max<size_t>(4, size_t(cfg.experts_per_rank()) * 4));
    EPMOE_CUDA_CHECK(cudaHostAlloc(&err_host_, sizeof(ErrorRecord), cudaHostAllocMapped));
    std::memset(err_host_, 0, sizeof(ErrorRecord));
    EPMOE_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&err_dev_), err_host_, 0));
    EPMOE_CUDA_CHECK(cudaDeviceSynchronize());
    if (ce_rows_ > 0) {
      peer_host_.resize(R_);
      EPMOE_CUDA_CHECK(cudaMemcpy(peer_host_.data(), peer_base_.get(), size_t(R_) * sizeof(void*), cudaMemcpyDeviceToHost));
      EPMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&ce_stream_, cudaStreamNonBlocking));
      EPMOE_CUDA_CHECK(cudaEventCreateWithFlags(&fork_ev_, cudaEventDisableTiming));
      EPMOE_CUDA_CHECK(cudaEventCreateWithFlags(&join_ev_, cudaEventDisableTiming));
    }
    // Also the barrier that keeps peers from writing before our window was cleared.
  }

  ~NvlinkDispatcher() override {
    const cuda::DeviceGuard dev(comm_.device_index(), std::nothrow);
    cudaDeviceSynchronize();
    // Local teardown only (no collective: dispatchers of one process are often destroyed one after
    // another on one thread). Every write into our window is one we waited for, so once every rank
    // has synchronised its last combine no peer can still touch it.
    if (have_dev_comm_ && comm_.handle()) ncclDevCommDestroy(comm_.handle(), &dev_comm_);
    if (win_ && comm_.handle()) ncclCommWindowDeregister(comm_.handle(), win_);
    if (window_mem_) ncclMemFree(window_mem_);
    if (err_host_) cudaFreeHost(err_host_);
    if (fork_ev_) cudaEventDestroy(fork_ev_);
    if (join_ev_) cudaEventDestroy(join_ev_);
    if (ce_stream_) cudaStreamDestroy(ce_stream_);
  }

  const char* name() const override { return "nvlink"; }

  DispatchOutput dispatch(const DispatchInput& in) override {
    const auto dev = comm_.activate();
    raise_recorded();
    have_dispatch_ = false;
    const int C = cfg_.capacity;
    const int64_t T = in.num_tokens;
    Args a = args(in.stream);
    a.T = T;
    a.T_in = T;
    const InputProblem local = check_input_shape(T, C, in.hidden, in.topk_ids, in.topk_weights);
    a.local_code = local.code;
    a.local_value = local.value;
    if (a.local_code != kOk) a.T = 0;  // the kernel reads nothing of a rejected input
    a.hidden = in.hidden;
    a.ids = in.topk_ids;
    a.w = in.topk_weights;
    const cudaStream_t st = static_cast<cudaStream_t>(in.stream);
    switch (cfg_.dispatch_format) {
      case ActFormat::bf16: dispatch_kernel<ActFormat::bf16><<<G_, kThreads, kDispatchSmem, st>>>(a); break;
      case ActFormat::fp8: dispatch_kernel<ActFormat::fp8><<<G_, kThreads, kDispatchSmem, st>>>(a); break;
      case ActFormat::nvfp4: dispatch_kernel<ActFormat::nvfp4><<<G_, kThreads, kDispatchSmem, st>>>(a); break;
    }
    EPMOE_CUDA_CHECK_LAUNCH();
    if (a.local_code != kOk) {
      // Our own input is bad: the kernel told every peer (nothing moves anywhere); raise now.
      sync(in.stream);
    }
    T_ = a.T;
    have_dispatch_ = true;
    const uint8_t* w = static_cast<const uint8_t*>(window_mem_);
    return make_dispatch_output(cfg_, DeviceKind::cuda,
                                RecvBuffers{w + L_.payload, w + L_.scales, reinterpret_cast<const int32_t*>(w + L_.ids),
                                            reinterpret_cast<const float*>(w + L_.weights),
                                            reinterpret_cast<State*>(state_.get())->counts,
                                            expert_counts_.get<int32_t>()});
  }

  void combine(const CombineInput& in, bf16_raw* out) override {
    const auto dev = comm_.activate();
    raise_recorded();
    if (!have_dispatch_) throw UsageError(combine_without_dispatch());
    have_dispatch_ = false;
    if (!out && T_ > 0) throw UsageError(combine_null_out(T_));
    Args a = args(in.stream);
    a.T = T_;
    a.y = in.y;
    a.out = out;
    const cudaStream_t st = static_cast<cudaStream_t>(in.stream);
    if (ce_rows_ > 0) copy_rows(in.y, st);
    if (cfg_.combine_format == ActFormat::fp8)
      combine_kernel<ActFormat::fp8><<<G_, kThreads, 0, st>>>(a);
    else
      combine_kernel<ActFormat::bf16><<<G_, kThreads, combine_smem(a.push_warps), st>>>(a);
    EPMOE_CUDA_CHECK_LAUNCH();
    if (ce_rows_ > 0) EPMOE_CUDA_CHECK(cudaStreamWaitEvent(st, join_ev_, 0));
  }

  // Copy-engine combine: region [s] of y (the rows this rank ran for source s's tokens) goes to
  // rank s's combine region [me] by cudaMemcpyAsync on a side stream, ce_rows_ rows per copy, each
  // copy followed by an 8-byte copy of the combine epoch (State::combines, read when the copy runs,
  // so CUDA-graph replays carry the right value) into the flag of the copy's first row. Stream order
  // puts the flag after its rows; the sum warps acquire it as they do the per-row flags of the push
  // warps. The host does not know how many rows are valid, so every copy covers capacity rows; the
  // rows past counts[s] are never read. A rejected dispatch leaves State::combines unchanged, so
  // its flags repeat an epoch nobody waits for. The side stream forks from and joins the caller's.
  void copy_rows(const bf16_raw* y, cudaStream_t st) {
    const int C = cfg_.capacity, H = cfg_.hidden;
    if (!y && C > 0)
      throw UsageError("combine: y is null; pass the runner's output [R * capacity, H] bf16 (the copy-engine combine "
                       "copies whole regions)");
    const size_t ps = payload_bytes(ActFormat::bf16, H);
    const uint64_t* epoch = &state_.get<State>()->combines;
    EPMOE_CUDA_CHECK(cudaEventRecord(fork_ev_, st));
    EPMOE_CUDA_CHECK(cudaStreamWaitEvent(ce_stream_, fork_ev_, 0));
    for (int r0 = 0; r0 < C; r0 += ce_rows_) {
      const int n = std::min(ce_rows_, C - r0);
      for (int k = 1; k < R_; ++k) {
        const int s = (me_ + k) % R_;
        const size_t row = size_t(me_) * C + r0;
        EPMOE_CUDA_CHECK(cudaMemcpyAsync(peer_host_[s] + L_.cpayload + row * ps, y + (size_t(s) * C + r0) * H,
                                         size_t(n) * ps, cudaMemcpyDeviceToDevice, ce_stream_));
        EPMOE_CUDA_CHECK(cudaMemcpyAsync(peer_host_[s] + L_.cflag + row * 8, epoch, 8, cudaMemcpyDeviceToDevice,
                                         ce_stream_));
      }
    }
    EPMOE_CUDA_CHECK(cudaEventRecord(join_ev_, ce_stream_));
  }

  // Waits for the stream (bounded by the kernels' own timeouts) and raises what they recorded.
  void sync(void* stream) override {
    const auto dev = comm_.activate();
    EPMOE_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
    raise_recorded();
  }

 private:
  Args args(void* stream) const {
    (void)stream;
    Args a{};
    a.f = cfg_.dispatch_format;
    a.cf = cfg_.combine_format;
    a.q = cfg_.quant_params();
    a.p = placement_->get();
    a.R = R_;
    a.me = me_;
    a.C = cfg_.capacity;
    a.H = cfg_.hidden;
    a.K = cfg_.top_k;
    a.E = cfg_.num_experts;
    a.E_loc = cfg_.experts_per_rank();
    a.timeout_ns = int64_t(cfg_.timeout_ms) * 1000000;
    a.L = L_;
    a.peer_base = peer_base_.get<uint8_t*>();
    a.S = state_.get<State>();
    a.err = err_dev_;
    a.chunk_counts = chunk_counts_.get<int32_t>();
    a.slot_map = slot_map_.get<int32_t>();
    a.expert_counts = expert_counts_.get<int32_t>();
    a.trace = trace_;
    a.push_warps = push_warps_;
    a.ce_rows = ce_rows_;
    return a;
  }

  // Raises what a kernel recorded (reads host-mapped memory; no synchronisation).
  void raise_recorded() {
    if (broken_) throw BackendError("dispatcher \"nvlink\" of rank " + std::to_string(me_) + " is unusable after: " + broken_what_);
    volatile ErrorRecord* e = err_host_;
    const int code = e->code;
    if (code == kErrNone) return;
    if (code == kErrTimeout) {
      static const char* where[] = {"?", "dispatch/status", "dispatch/payload", "combine/payload", "grid barrier"};
      const int w = e->where >= 0 && e->where <= 4 ? e->where : 0;
      broken_ = true;
      broken_what_ = "rank " + std::to_string(e->rank) + " did not arrive within " + std::to_string(cfg_.timeout_ms) +
                     " ms at " + where[w] + " (seen by rank " + std::to_string(me_) + ")";
      throw TimeoutError("dispatcher \"nvlink\": " + broken_what_ +
                             "; every rank must call dispatch/combine the same number of times. Raise "
                             "MoeConfig::timeout_ms (--timeout-ms) if a rank is just slow. The dispatcher is "
                             "unusable now",
                         e->rank);
    }
    std::vector<std::string> problems(R_);
    for (int r = 0; r < R_; ++r) {
      int32_t rec[kRecordInts];
      for (int i = 0; i < kRecordInts; ++i) rec[i] = e->bad[r][i];
      problems[r] = input_message(decode_input_record(rec), r, cfg_.capacity, cfg_.num_experts);
    }
    e->code = kErrNone;
    for (int r = 0; r < R_; ++r) e->bad[r][kRecCode] = kOk;
    throw UsageError(rejected_dispatch(problems));
  }

  MoeConfig cfg_;
  NcclComm& comm_;
  int R_, me_, G_ = 24;
  int push_warps_ = 0;            // cfg.tuning.push_warps (any value gives the same results)
  int ce_rows_ = 0;               // rows per copy-engine copy; 0: the push warps move the combine rows
  std::vector<uint8_t*> peer_host_;  // peer_base_ on the host (copy-engine combine)
  cudaStream_t ce_stream_ = nullptr;
  cudaEvent_t fork_ev_ = nullptr, join_ev_ = nullptr;
  std::unique_ptr<DevicePlacement> placement_;
  Layout L_{};
  void* window_mem_ = nullptr;
  ncclWindow_t win_ = nullptr;
  ncclDevComm dev_comm_{};
  bool have_dev_comm_ = false;
  cuda::DeviceBuffer peer_base_, state_, chunk_counts_, slot_map_, expert_counts_;
  ErrorRecord* err_host_ = nullptr;
  ErrorRecord* err_dev_ = nullptr;
  int64_t T_ = 0;
  bool have_dispatch_ = false;
  bool broken_ = false;
  std::string broken_what_;

 public:
  uint64_t* trace_ = nullptr;  // nvlink_set_trace
};

}  // namespace

std::unique_ptr<Dispatcher> make_nvlink_dispatcher(const MoeConfig& cfg, Communicator& comm) {
  return std::make_unique<NvlinkDispatcher>(cfg, comm);
}

void nvlink_set_trace(Dispatcher& d, uint64_t* stamps) {
  if (auto* n = dynamic_cast<NvlinkDispatcher*>(&d)) n->trace_ = stamps;
}

}  // namespace epmoe::detail
