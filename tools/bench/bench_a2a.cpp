// `epmoe bench a2a`: dispatch and combine times of the multi-GPU dispatchers on every GPU of the job
// (one process with a thread per GPU, or one process per GPU under mpirun), for each preset of
// --preset (formats a shape cannot take are skipped and said), with the baselines
// printed in the same run: the copy-engine peer copy of the same link bytes (the link ceiling) and
// NCCL's all-to-all (ncclSend/ncclRecv in a group) of the same bytes, plus link vs logical bytes.
// Every rank runs the code below for itself; rank 0 prints.
#if defined(EPMOE_WITH_NCCL)
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "args.h"
#include "bench_timer.h"
#include "bench_util.h"
#include "comm/launch.h"
#include "comm/nccl/nccl_comm_impl.h"
#include "setup.h"
#include "commands.h"
#include "core/cuda/check.h"
#include "dispatch/a2a/host.h"
#include "dispatch/nvlink/grid.h"
#include "dispatch/nvlink/nvlink_trace.h"
#include "epmoe/epmoe.h"
#include "epmoe/nccl_comm.h"

namespace epmoe::cli {
namespace {

using cuda::DeviceBuffer;

struct Opts {
  std::vector<const ModelPreset*> presets;
  const ModelPreset* preset = nullptr;  // the one being measured
  std::vector<long long> Ts;
  std::vector<ActFormat> fmts;
  std::vector<std::string> disps;
  int reps = 50;
  const Flags* flags = nullptr;  // the shared configuration and tuning flags
  bool phases = false;  // nvlink: CTA 0's phase stamps
  bool graph = false;   // the timed steps captured in one CUDA graph and replayed
};

// One rank's inputs and baseline buffers.
struct RankData {
  DeviceBuffer hidden, ids, w, y, out, a2a_send, a2a_recv, peer_buf;
  cudaStream_t st = nullptr;
  RankData() { EPMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking)); }
  ~RankData() { cudaStreamDestroy(st); }
};

// Times op on d's stream `reps` times after 3 warm-up calls, each call synchronized; us.
template <class F>
std::vector<double> time_each_us(RankData& d, int reps, F&& op) {
  return cli::time_each_us(d.st, TimeSpec{3, reps, false, true}, op);
}

// Rank 1's `buf` as a device pointer rank 0 can copy into with the copy engine (collective; only
// rank 0's result is meaningful). One process: the raw pointer (peer access is enabled by then).
// One process per GPU: a CUDA IPC handle, opened in rank 0 (close it with cudaIpcCloseMemHandle).
// The values travel as doubles through the result all-gather; NCCL moves their bytes unchanged.
void* rank1_buffer(Communicator& comm, void* buf, bool ipc) {
  std::vector<double> mine;
  if (ipc) {
    cudaIpcMemHandle_t h{};
    if (comm.rank() == 1) EPMOE_CUDA_CHECK(cudaIpcGetMemHandle(&h, buf));
    static_assert(sizeof h % sizeof(double) == 0, "IPC handle size");
    mine.resize(sizeof h / sizeof(double));
    std::memcpy(mine.data(), &h, sizeof h);
  } else {
    mine.resize(1);
    const uint64_t v = reinterpret_cast<uintptr_t>(buf);
    std::memcpy(mine.data(), &v, 8);
  }
  const std::vector<double> all = allgather(comm, mine);
  if (comm.rank() != 0) return nullptr;
  const double* r1 = all.data() + mine.size();
  if (ipc) {
    cudaIpcMemHandle_t h{};
    std::memcpy(&h, r1, sizeof h);
    void* p = nullptr;
    EPMOE_CUDA_CHECK(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess));
    return p;
  }
  uint64_t v = 0;
  std::memcpy(&v, r1, 8);
  return reinterpret_cast<void*>(static_cast<uintptr_t>(v));
}

// N(0,1) activations, K distinct uniform experts per token (fixed seeds per rank), uploaded on d.st.
void make_inputs(RankData& d, int r, int R, long long maxT, int H, int E, int K) {
  std::vector<bf16_raw> h(size_t(maxT) * H);
  std::vector<int32_t> ids(size_t(maxT) * K);
  std::vector<float> w(size_t(maxT) * K);
  std::mt19937 rng(1000 + r);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (size_t i = 0; i < h.size(); ++i) h[i] = num::f32_to_bf16(nd(rng));
  std::vector<int> perm(E);
  for (long long t = 0; t < maxT; ++t) {
    for (int e = 0; e < E; ++e) perm[e] = e;
    for (int k = 0; k < K; ++k) {
      std::swap(perm[k], perm[k + rng() % (E - k)]);
      ids[t * K + k] = perm[k];
      w[t * K + k] = 1.f / K;
    }
  }
  d.hidden.reserve(h.size() * 2);
  d.ids.reserve(ids.size() * 4);
  d.w.reserve(w.size() * 4);
  EPMOE_CUDA_CHECK(cudaMemcpyAsync(d.hidden.get(), h.data(), h.size() * 2, cudaMemcpyHostToDevice, d.st));
  EPMOE_CUDA_CHECK(cudaMemcpyAsync(d.ids.get(), ids.data(), ids.size() * 4, cudaMemcpyHostToDevice, d.st));
  EPMOE_CUDA_CHECK(cudaMemcpyAsync(d.w.get(), w.data(), w.size() * 4, cudaMemcpyHostToDevice, d.st));
  // y: the runner's output stand-in, random too (never time on zeros).
  d.y.reserve(size_t(R) * maxT * H * 2);
  for (int s = 0; s < R; ++s)
    EPMOE_CUDA_CHECK(cudaMemcpyAsync(d.y.get<uint8_t>() + size_t(s) * maxT * H * 2, h.data(), h.size() * 2,
                                     cudaMemcpyHostToDevice, d.st));
  d.out.reserve(size_t(maxT) * H * 2);
  // Baseline buffers: one bf16 row plus ids/weights per token and peer.
  const size_t row_max = size_t(H) * 2 + size_t(K) * 8;
  d.a2a_send.reserve(size_t(maxT) * row_max * R);
  d.a2a_recv.reserve(size_t(maxT) * row_max * R);
  d.peer_buf.reserve(size_t(maxT) * row_max * R);
  EPMOE_CUDA_CHECK(cudaStreamSynchronize(d.st));  // the pageable sources go out of scope
}

struct Point {
  double dispatch_us = 0, combine_us = 0, ce_us = 0, nccl_us = 0;
  double link_bytes = 0, logical_bytes = 0;  // dispatch, rank 0's view, per call
  double combine_link_bytes = 0;             // combine rows rank 0 sends over NVLink
  std::vector<double> phase_us;              // --phases, nvlink: median us of each phase (below)
};

// The phases `--phases` prints, as (from, to) trace points of detail::NvlTrace.
struct Phase {
  const char* name;
  int from, to;
};
constexpr Phase kPhases[] = {{"count", detail::kTrDispatchStart, detail::kTrChunkCounted},
                             {"barrier", detail::kTrChunkCounted, detail::kTrCounted},
                             {"status out", detail::kTrCounted, detail::kTrStatusSent},
                             {"slots", detail::kTrStatusSent, detail::kTrSlotsDone},
                             {"status wait", detail::kTrSlotsDone, detail::kTrStatuses},
                             {"push", detail::kTrStatuses, detail::kTrPushed},
                             {"arrival", detail::kTrPushed, detail::kTrArrived},
                             {"finish", detail::kTrArrived, detail::kTrDispatchEnd},
                             {"gap", detail::kTrDispatchEnd, detail::kTrCombineStart},
                             {"c.push", detail::kTrCombineStart, detail::kTrCombinePushed},
                             {"c.total", detail::kTrCombineStart, detail::kTrCombineEnd},
                             // Kernel spans, first CTA start to last CTA end (a profiler's kernel time).
                             {"d.kernel", detail::kTrDispatchFirst, detail::kTrDispatchLastInv},
                             {"c.kernel", detail::kTrCombineFirst, detail::kTrCombineLastInv},
                             // Spread of the CTAs: first to last start, first to last end.
                             {"d.starts", detail::kTrDispatchFirst, detail::kTrDispatchLastStartInv},
                             {"d.ends", detail::kTrDispatchFirstEnd, detail::kTrDispatchLastInv},
                             {"c.starts", detail::kTrCombineFirst, detail::kTrCombineLastStartInv},
                             {"c.ends", detail::kTrCombineFirstEnd, detail::kTrCombineLastInv}};

// Dispatch + combine of one configuration on this rank; rank 0's figures matter.
Point time_dispatcher(Communicator& comm, RankData& d, const MoeConfig& cfg, long long T, int reps, void* r1_buf,
                      bool phases, bool graph) {
  const int r = comm.rank(), R = comm.size(), H = cfg.hidden, K = cfg.top_k;
  auto disp = Registry::global().find_dispatcher(cfg.dispatcher)->create(cfg, comm);
  DispatchInput di;
  di.num_tokens = T;
  di.hidden = d.hidden.get<bf16_raw>();
  di.topk_ids = d.ids.get<int32_t>();
  di.topk_weights = d.w.get<float>();
  di.stream = d.st;
  CombineInput ci;
  ci.y = d.y.get<bf16_raw>();
  ci.stream = d.st;
  // Warm-up, then `reps` steps queued back to back (no host sync in between, as in a model's forward
  // pass), each bracketed by its own events.
  DispatchOutput o{};
  for (int i = 0; i < 5; ++i) {
    o = disp->dispatch(di);
    disp->combine(ci, d.out.get<bf16_raw>());
  }
  detail::gpu_dispatcher_sync(*disp, d.st);
  std::vector<cudaEvent_t> ev(size_t(3) * reps);
  for (auto& e : ev) EPMOE_CUDA_CHECK(cudaEventCreate(&e));
  const bool trace = phases && cfg.dispatcher == "nvlink";
  DeviceBuffer stamps(trace ? size_t(reps) * detail::kNvlTrace * 8 : 8);
  if (trace) {  // all ones: the span slots are folded with atomicMin (nvlink_trace.h)
    EPMOE_CUDA_CHECK(cudaMemsetAsync(stamps.get(), 0xff, size_t(reps) * detail::kNvlTrace * 8, d.st));
    EPMOE_CUDA_CHECK(cudaStreamSynchronize(d.st));
  }
  // Graph mode: the same steps (events included, as event-record nodes) captured once and replayed,
  // so no host launch sits between two kernels (how a serving engine runs a decode step).
  auto record = [&](cudaEvent_t e) {
    EPMOE_CUDA_CHECK(graph ? cudaEventRecordWithFlags(e, d.st, cudaEventRecordExternal) : cudaEventRecord(e, d.st));
  };
  cudaGraph_t g = nullptr;
  cudaGraphExec_t exec = nullptr;
  if (graph) EPMOE_CUDA_CHECK(cudaStreamBeginCapture(d.st, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < reps; ++i) {
    if (trace) detail::nvlink_set_trace(*disp, stamps.get<uint64_t>() + size_t(i) * detail::kNvlTrace);
    record(ev[3 * i]);
    o = disp->dispatch(di);
    record(ev[3 * i + 1]);
    disp->combine(ci, d.out.get<bf16_raw>());
    record(ev[3 * i + 2]);
  }
  if (graph) {
    EPMOE_CUDA_CHECK(cudaStreamEndCapture(d.st, &g));
    EPMOE_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
    EPMOE_CUDA_CHECK(cudaGraphUpload(exec, d.st));
    EPMOE_CUDA_CHECK(cudaGraphLaunch(exec, d.st));  // warm-up replay; its stamps are discarded
    if (trace) EPMOE_CUDA_CHECK(cudaMemsetAsync(stamps.get(), 0xff, size_t(reps) * detail::kNvlTrace * 8, d.st));
    EPMOE_CUDA_CHECK(cudaGraphLaunch(exec, d.st));
  }
  detail::gpu_dispatcher_sync(*disp, d.st);
  if (graph) {
    EPMOE_CUDA_CHECK(cudaGraphExecDestroy(exec));
    EPMOE_CUDA_CHECK(cudaGraphDestroy(g));
  }
  if (trace) detail::nvlink_set_trace(*disp, nullptr);
  std::vector<double> td, tc;
  for (int i = 0; i < reps; ++i) {
    float a = 0, b = 0;
    EPMOE_CUDA_CHECK(cudaEventElapsedTime(&a, ev[3 * i], ev[3 * i + 1]));
    EPMOE_CUDA_CHECK(cudaEventElapsedTime(&b, ev[3 * i + 1], ev[3 * i + 2]));
    td.push_back(a * 1e3);
    tc.push_back(b * 1e3);
  }
  for (auto& e : ev) cudaEventDestroy(e);
  // Bytes this rank received (logical) and those that crossed a link.
  std::vector<int32_t> counts(R);
  EPMOE_CUDA_CHECK(cudaMemcpy(counts.data(), o.counts, size_t(R) * 4, cudaMemcpyDeviceToHost));
  const ActFormat f = cfg.dispatch_format, cf = cfg.combine_format;
  const double row = double(payload_bytes(f, H) + scale_bytes(f, H) + 8 * K);
  const double crow = double(payload_bytes(cf, H) + scale_bytes(cf, H));
  Point pt;
  for (int s = 0; s < R; ++s) {
    pt.logical_bytes += counts[s] * row;
    if (s != r) pt.link_bytes += counts[s] * row;
    if (s != r) pt.combine_link_bytes += counts[s] * crow;  // rows of other ranks' tokens go back to them
  }
  pt.dispatch_us = median(td);
  pt.combine_us = median(tc);
  if (trace) {
    std::vector<uint64_t> h(size_t(reps) * detail::kNvlTrace);
    EPMOE_CUDA_CHECK(cudaMemcpy(h.data(), stamps.get(), h.size() * 8, cudaMemcpyDeviceToHost));
    for (int i = 0; i < reps; ++i)  // the last-end slots hold the complement of the time
      for (int k : {int(detail::kTrDispatchLastInv), int(detail::kTrCombineLastInv),
                    int(detail::kTrDispatchLastStartInv), int(detail::kTrCombineLastStartInv)}) {
        uint64_t& v = h[size_t(i) * detail::kNvlTrace + k];
        v = ~v;
      }
    for (const Phase& ph : kPhases) {
      std::vector<double> v;
      for (int i = 0; i < reps; ++i) {
        const uint64_t* s = &h[size_t(i) * detail::kNvlTrace];
        v.push_back(double(int64_t(s[ph.to] - s[ph.from])) * 1e-3);
      }
      pt.phase_us.push_back(median(v));
    }
  }
  // Copy-engine copy of the same link bytes into rank 1's memory (rank 0 only).
  if (r == 0 && r1_buf) {
    const size_t n = size_t(pt.link_bytes);
    pt.ce_us = median(time_each_us(d, reps, [&] {
      EPMOE_CUDA_CHECK(cudaMemcpyAsync(r1_buf, d.a2a_send.get(), n, cudaMemcpyDeviceToDevice, d.st));
    }));
  }
  return pt;
}

// NCCL all-to-all of `per_peer` bytes to and from every peer (the same size on every rank).
double time_nccl_a2a(Communicator& comm, RankData& d, size_t per_peer, int reps) {
  const int r = comm.rank(), R = comm.size();
  ncclComm_t nc = nccl_handle(comm);
  return median(time_each_us(d, reps, [&] {
    EPMOE_NCCL_CHECK(ncclGroupStart());
    for (int p = 0; p < R; ++p) {
      if (p == r) continue;
      EPMOE_NCCL_CHECK(ncclSend(d.a2a_send.get<uint8_t>() + p * per_peer, per_peer, ncclUint8, p, nc, d.st));
      EPMOE_NCCL_CHECK(ncclRecv(d.a2a_recv.get<uint8_t>() + p * per_peer, per_peer, ncclUint8, p, nc, d.st));
    }
    EPMOE_NCCL_CHECK(ncclGroupEnd());
  }));
}

void a2a_rank(Communicator& comm, const Opts& o) {
  const int r = comm.rank(), R = comm.size();
  const bool talk = r == 0 && rank0_process();
  const ModelPreset& pre = *o.preset;
  const int H = pre.config.hidden, E = pre.config.num_experts, K = pre.config.top_k;
  const long long maxT = *std::max_element(o.Ts.begin(), o.Ts.end());
  if (talk) {
    cudaDeviceProp prop{};
    EPMOE_CUDA_CHECK(cudaGetDeviceProperties(&prop, comm.device_index()));
    Tuning t;
    apply_tuning_flags(*o.flags, t);
    std::printf("# epmoe bench a2a: %d x %s (%s), %s H=%d E=%d K=%d, NCCL %s (compiled %s), median of %d, "
                "nvlink grid %d CTAs (comm_sms %d)\n",
                R, prop.name, under_mpirun() ? "one process per GPU" : "one process, a thread per GPU",
                pre.name.c_str(), H, E, K, nccl_runtime_version().c_str(), nccl_compiled_version().c_str(), o.reps,
                nvlink::comm_grid(t.comm_sms, prop.multiProcessorCount), t.comm_sms);
  }
  RankData d;
  make_inputs(d, r, R, maxT, H, E, K);
  const bool ipc = under_mpirun();
  if (!ipc)  // one process: the copy engines reach the other GPUs' memory through peer access
    for (int p = 0; p < R; ++p)
      if (p != comm.device_index()) {
        const cudaError_t e = cudaDeviceEnablePeerAccess(p, 0);
        if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) EPMOE_CUDA_CHECK(e);
        cudaGetLastError();
      }
  comm.check_same(uint64_t(maxT), "bench a2a: inputs ready");

  // Link ceiling: a 1 GiB copy-engine copy 0 -> 1 (rank 1's buffer opened in rank 0).
  {
    DeviceBuffer big(size_t(1) << 30);
    void* r1 = rank1_buffer(comm, big.get(), ipc);
    if (r == 0) {
      const size_t bytes = size_t(1) << 30;
      DeviceBuffer src(bytes);
      std::vector<double> ts = time_each_us(d, 5, [&] {
        EPMOE_CUDA_CHECK(cudaMemcpyAsync(r1, src.get(), bytes, cudaMemcpyDeviceToDevice, d.st));
      });
      if (ipc) EPMOE_CUDA_CHECK(cudaIpcCloseMemHandle(r1));
      if (talk) std::printf("# copy-engine copy rank 0 -> 1, 1 GiB: %.0f GB/s (link ceiling)\n", bytes / median(ts) / 1e3);
    }
    comm.check_same(1, "bench a2a: link ceiling measured");  // rank 1 keeps `big` until rank 0 is done
  }
  void* r1_buf = rank1_buffer(comm, d.peer_buf.get(), ipc);

  if (talk)
    std::printf("%-7s %-6s %6s | %9s %9s | %9s %9s %7s | %9s %9s | %6s %6s | %7s %7s\n", "disp", "format", "T",
                "disp_us", "comb_us", "link_MB", "logic_MB", "link/lg", "CE_us", "NCCLa2a", "CE/d", "NCCL/d", "d_GB/s",
                "c_GB/s");
  for (const std::string& dname : o.disps) {
    for (long long T : o.Ts) {
      for (ActFormat f : o.fmts) {
        MoeConfig cfg = pre.config;
        apply_config_flags(*o.flags, cfg);  // --hidden, --ue8m0, --timeout-ms and the tuning flags
        cfg.num_ranks = R;
        cfg.capacity = static_cast<int>(T);
        cfg.dispatch_format = f;
        cfg.combine_format = ActFormat::bf16;
        if (f == ActFormat::nvfp4 && cfg.nvfp4_global_scale <= 0) cfg.nvfp4_global_scale = 448.f * 6.f / 5.f;
        cfg.dispatcher = dname;
        cfg.runner = "cuda";
        cfg.placement.reset();
        // A format the shape cannot take (fp8 and nvfp4 need H % 16 == 0, ...) is skipped and said; every
        // rank decides alike from the same configuration.
        try {
          detail::check_gpu_a2a_config(cfg, R, r, "bench a2a");
        } catch (const UsageError& e) {
          if (talk) std::printf("%-7s %-6s %6lld | skipped: %s\n", dname.c_str(), format_name(f), T, e.what());
          continue;
        }
        Point pt = time_dispatcher(comm, d, cfg, T, o.reps, r1_buf, o.phases, o.graph);
        // Every rank's phases (the same count on each): a rank that waits in "statuses" waits for a peer.
        const std::vector<double> phases_all = pt.phase_us.empty() ? std::vector<double>{} : allgather(comm, pt.phase_us);
        // NCCL all-to-all of rank 0's link bytes, the same size on every rank (p2p sizes must match).
        const double link0 = allgather(comm, {pt.link_bytes})[0];
        const size_t per_peer = R > 1 ? size_t(link0 / (R - 1)) : 0;
        pt.nccl_us = time_nccl_a2a(comm, d, per_peer, o.reps);
        if (talk) {
          std::printf("%-7s %-6s %6lld | %9.1f %9.1f | %9.2f %9.2f %7.2f | %9.1f %9.1f | %6.2f %6.2f | %7.0f %7.0f\n",
                      dname.c_str(), format_name(f), T, pt.dispatch_us, pt.combine_us, pt.link_bytes / 1e6,
                      pt.logical_bytes / 1e6, pt.logical_bytes > 0 ? pt.link_bytes / pt.logical_bytes : 0.0, pt.ce_us,
                      pt.nccl_us, pt.dispatch_us > 0 ? pt.ce_us / pt.dispatch_us : 0.0,
                      pt.dispatch_us > 0 ? pt.nccl_us / pt.dispatch_us : 0.0,
                      pt.dispatch_us > 0 ? pt.link_bytes / pt.dispatch_us / 1e3 : 0.0,
                      pt.combine_us > 0 ? pt.combine_link_bytes / pt.combine_us / 1e3 : 0.0);
          const size_t np = pt.phase_us.size();
          for (int q = 0; np > 0 && q < R; ++q) {
            std::printf("        phases (rank %d, CTA 0, median us):", q);
            for (size_t i = 0; i < np; ++i) std::printf(" %s %.1f", kPhases[i].name, phases_all[q * np + i]);
            std::printf("\n");
          }
          std::fflush(stdout);
        }
      }
    }
  }
  if (ipc && r1_buf) EPMOE_CUDA_CHECK(cudaIpcCloseMemHandle(r1_buf));
  comm.check_same(1, "bench a2a: finished");  // nobody frees what a peer may still open or copy into
  if (talk)
    std::printf("# link_MB/logic_MB: dispatch bytes rank 0 received over NVLink / including its own tokens "
                "(payload+scales+ids+weights). CE_us: copy-engine copy of link_MB into rank 1; NCCLa2a: "
                "ncclSend/Recv group of link_MB per peer. CE/d, NCCL/d > 1: the dispatcher is faster than that "
                "baseline. d_GB/s, c_GB/s: NVLink bytes into rank 0 per dispatch (link_MB) / out of rank 0 per "
                "combine (its rows of other ranks' tokens, in the combine format) over the measured time.\n");
}

int bench_a2a(const std::vector<std::string>& args) {
  Flags flags("bench a2a");
  flags.add("preset", "LIST", "model shapes: a name, a comma list, or all (default deepseek-v3)");
  flags.add("tokens", "LIST", "tokens per rank (default 128,512,4096,16384)");
  flags.add("formats", "LIST", "dispatch formats (default bf16,fp8,nvfp4)");
  flags.add("dispatchers", "LIST", "nvlink,nccl (default both)");
  flags.add("reps", "N", "timed repetitions (median; default 50, quick 20)");
  flags.add("quick", "", "tokens 128,4096 and fewer repetitions");
  flags.add("phases", "",
            "nvlink: also print the median time of each kernel phase (CTA 0 of each rank) and each kernel's span "
            "over all its CTAs (d.kernel, c.kernel: first start to last end, what a profiler reports)");
  flags.add("graph", "", "capture the timed dispatch+combine steps in one CUDA graph and replay it (no host launch "
            "gaps; the nvlink dispatcher only, nccl is not capturable)");
  // The configuration fields the sweep leaves free, and every tuning option (--comm-sms,
  // --push-warps, --combine-mode, --ce-rows for nvlink).
  add_config_flags_only(flags, {"hidden", "ue8m0", "timeout-ms"});
  add_tuning_flags(flags);
  if (wants_help(args)) {
    std::printf("usage: epmoe bench a2a [flags]\nRuns on every visible GPU (one process), or one process per GPU "
                "under mpirun -np N.\n%s",
                flags.help().c_str());
    return 0;
  }
  flags.parse(args);
  Opts o;
  const bool quick = flags.get_bool("quick", false);
  o.Ts = quick ? std::vector<long long>{128, 4096} : std::vector<long long>{128, 512, 4096, 16384};
  if (flags.has("tokens")) o.Ts = parse_int_list(flags.get("tokens"), "--tokens");
  o.fmts = parse_act_formats(flags.has("formats") ? flags.get("formats") : "bf16,fp8,nvfp4", "formats");
  o.disps = split_list(flags.has("dispatchers") ? flags.get("dispatchers") : "nvlink,nccl", "dispatchers");
  for (const std::string& dn : o.disps)
    if (dn != "nvlink" && dn != "nccl")
      throw UsageError("--dispatchers: '" + dn + "' is not a multi-GPU dispatcher; use nvlink, nccl or both");
  o.reps = flags.get_int("reps", quick ? 20 : 50);
  if (o.reps <= 0) throw UsageError("--reps: " + std::to_string(o.reps) + " must be positive");
  o.flags = &flags;
  {
    Tuning t;
    apply_tuning_flags(flags, t);
    for (const ConfigIssue& is : validate(t)) throw UsageError(is.message);
  }
  o.phases = flags.get_bool("phases", false);
  o.graph = flags.get_bool("graph", false);
  if (o.graph)
    for (const std::string& dn : o.disps)
      if (dn != "nvlink")
        throw UsageError("--graph: the '" + dn + "' dispatcher synchronises with the host and cannot be captured; "
                         "use --dispatchers nvlink");
  o.presets = parse_presets(flags.has("preset") ? flags.get("preset") : "deepseek-v3");
  const int R = default_gpu_ranks();
  if (R < 2) {
    std::fprintf(stderr, "bench a2a: needs at least 2 GPUs (or mpirun -np 2 or more), found %d\n", R);
    return 1;
  }
  // One job per preset (its own communicators, buffers and in-run baselines).
  for (size_t i = 0; i < o.presets.size(); ++i) {
    o.preset = o.presets[i];
    if (o.presets.size() > 1 && rank0_process())
      std::fprintf(stderr, "[bench a2a] preset %zu/%zu: %s\n", i + 1, o.presets.size(), o.preset->name.c_str());
    launch_gpu_ranks(R, 60000, [&](Communicator& comm) { a2a_rank(comm, o); });
  }
  return 0;
}

const BenchRegistrar reg{{"a2a", "dispatch/combine of the multi-GPU dispatchers vs copy engine and NCCL all-to-all",
                          bench_a2a}};

}  // namespace
}  // namespace epmoe::cli
#endif  // EPMOE_WITH_NCCL
