// `epmoe bench a2a`: dispatch and combine times of the multi-GPU dispatchers on all local GPUs
// (one thread per GPU), with the baselines printed in the same run: the copy-engine peer copy of
// the same link bytes (cudaMemcpyPeerAsync, the link ceiling) and NCCL's all-to-all
// (ncclSend/ncclRecv in a group) of the same bytes, plus link bytes vs logical bytes.
#if defined(EPMOE_WITH_NCCL)
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "args.h"
#include "bench_util.h"
#include "commands.h"
#include "core/cuda/check.h"
#include "dispatch/nccl/a2a_host.h"
#include "epmoe/epmoe.h"
#include "epmoe/nccl_comm.h"

namespace epmoe::cli {
namespace {

struct RankData {
  void* hidden = nullptr;
  void* ids = nullptr;
  void* w = nullptr;
  void* y = nullptr;
  void* out = nullptr;
  void* a2a_send = nullptr;
  void* a2a_recv = nullptr;
  void* peer_buf = nullptr;
  cudaStream_t st = nullptr;
  cudaEvent_t ev[3] = {};
};

// Times op on d's stream `reps` + 3 times, each between d.ev[0] and d.ev[1] and synchronized;
// returns the last `reps` times in us (the first 3 warm up).
template <class F>
std::vector<double> time_each_us(RankData& d, int reps, F&& op) {
  std::vector<double> t;
  for (int i = 0; i < reps + 3; ++i) {
    EPMOE_CUDA_CHECK(cudaEventRecord(d.ev[0], d.st));
    op();
    EPMOE_CUDA_CHECK(cudaEventRecord(d.ev[1], d.st));
    EPMOE_CUDA_CHECK(cudaEventSynchronize(d.ev[1]));
    float a = 0;
    EPMOE_CUDA_CHECK(cudaEventElapsedTime(&a, d.ev[0], d.ev[1]));
    if (i >= 3) t.push_back(a * 1e3);
  }
  return t;
}

struct Point {
  double dispatch_us = 0, combine_us = 0, ce_us = 0, nccl_us = 0;
  double link_bytes = 0, logical_bytes = 0;  // dispatch, rank 0's view, per call
  double combine_link_bytes = 0;             // combine rows rank 0 sends over NVLink
};

int bench_a2a(const std::vector<std::string>& args) {
  Flags flags("bench a2a");
  flags.add("preset", "NAME", "model shape (default deepseek-v3)");
  flags.add("tokens", "LIST", "tokens per rank (default 128,512,4096,16384)");
  flags.add("formats", "LIST", "dispatch formats (default bf16,fp8,nvfp4)");
  flags.add("dispatchers", "LIST", "nvlink,nccl (default both)");
  flags.add("comm-sms", "N", "SMs for the nvlink kernels (default 24)");
  flags.add("reps", "N", "timed repetitions (median; default 50, quick 20)");
  flags.add("quick", "", "tokens 128,4096 and fewer repetitions");
  if (wants_help(args)) {
    std::printf("usage: epmoe bench a2a [flags]\n%s", flags.help().c_str());
    return 0;
  }
  flags.parse(args);
  int ngpu = 0;
  if (cudaGetDeviceCount(&ngpu) != cudaSuccess || ngpu < 2) {
    std::fprintf(stderr, "bench a2a: needs at least 2 GPUs, found %d\n", ngpu);
    return 1;
  }
  const bool quick = flags.get_bool("quick", false);
  std::vector<long long> Ts = quick ? std::vector<long long>{128, 4096} : std::vector<long long>{128, 512, 4096, 16384};
  if (flags.has("tokens")) Ts = parse_int_list(flags.get("tokens"), "--tokens");
  const std::vector<ActFormat> fmts =
      parse_act_formats(flags.has("formats") ? flags.get("formats") : "bf16,fp8,nvfp4", "formats");
  std::vector<std::string> disps = {"nvlink", "nccl"};
  if (flags.has("dispatchers")) {
    disps.clear();
    std::string s = flags.get("dispatchers");
    size_t pos = 0;
    while (pos <= s.size()) {
      const size_t c = s.find(',', pos);
      disps.push_back(s.substr(pos, c == std::string::npos ? std::string::npos : c - pos));
      if (c == std::string::npos) break;
      pos = c + 1;
    }
  }
  const int reps = flags.get_int("reps", quick ? 20 : 50);
  const ModelPreset& pre = preset(flags.has("preset") ? flags.get("preset") : "deepseek-v3");
  const int R = ngpu;
  const int H = pre.config.hidden, E = pre.config.num_experts, K = pre.config.top_k;
  const long long maxT = *std::max_element(Ts.begin(), Ts.end());
  cudaDeviceProp prop{};
  EPMOE_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("# epmoe bench a2a: %d x %s, %s H=%d E=%d K=%d, NCCL %s (compiled %s), median of %d\n", R, prop.name,
              pre.name.c_str(), H, E, K, nccl_runtime_version().c_str(), nccl_compiled_version().c_str(), reps);

  std::vector<int> devs(R);
  for (int r = 0; r < R; ++r) devs[r] = r;
  auto comms = make_nccl_group(devs, 60000);

  // Inputs: N(0,1) activations, K distinct uniform experts per token, per rank (fixed seeds).
  std::vector<RankData> rd(R);
  {
    std::vector<bf16_raw> h(size_t(maxT) * H);
    std::vector<int32_t> ids(size_t(maxT) * K);
    std::vector<float> w(size_t(maxT) * K);
    for (int r = 0; r < R; ++r) {
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
      EPMOE_CUDA_CHECK(cudaSetDevice(r));
      RankData& d = rd[r];
      EPMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&d.st, cudaStreamNonBlocking));
      for (auto& e : d.ev) EPMOE_CUDA_CHECK(cudaEventCreate(&e));
      EPMOE_CUDA_CHECK(cudaMalloc(&d.hidden, h.size() * 2));
      EPMOE_CUDA_CHECK(cudaMalloc(&d.ids, ids.size() * 4));
      EPMOE_CUDA_CHECK(cudaMalloc(&d.w, w.size() * 4));
      EPMOE_CUDA_CHECK(cudaMemcpy(d.hidden, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
      EPMOE_CUDA_CHECK(cudaMemcpy(d.ids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
      EPMOE_CUDA_CHECK(cudaMemcpy(d.w, w.data(), w.size() * 4, cudaMemcpyHostToDevice));
      // y: the runner's output stand-in, random too (never time on zeros).
      EPMOE_CUDA_CHECK(cudaMalloc(&d.y, size_t(R) * maxT * H * 2));
      for (int s = 0; s < R; ++s)
        EPMOE_CUDA_CHECK(cudaMemcpy(static_cast<uint8_t*>(d.y) + size_t(s) * maxT * H * 2, h.data(), h.size() * 2,
                                    cudaMemcpyHostToDevice));
      EPMOE_CUDA_CHECK(cudaMalloc(&d.out, size_t(maxT) * H * 2));
      // Baseline buffers: one bf16 row plus ids/weights per token and peer.
      const size_t row_max = size_t(H) * 2 + size_t(K) * 8;
      EPMOE_CUDA_CHECK(cudaMalloc(&d.a2a_send, size_t(maxT) * row_max * R));
      EPMOE_CUDA_CHECK(cudaMalloc(&d.a2a_recv, size_t(maxT) * row_max * R));
      EPMOE_CUDA_CHECK(cudaMalloc(&d.peer_buf, size_t(maxT) * row_max));
      // The legacy-stream uploads above may still be in flight; d.st does not wait for them.
      EPMOE_CUDA_CHECK(cudaDeviceSynchronize());
    }
    for (int r = 0; r < R; ++r) {
      EPMOE_CUDA_CHECK(cudaSetDevice(r));
      for (int p = 0; p < R; ++p)
        if (p != r) {
          const cudaError_t e = cudaDeviceEnablePeerAccess(p, 0);
          if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) EPMOE_CUDA_CHECK(e);
          cudaGetLastError();
        }
    }
  }

  // Link ceiling: 1 GiB copy-engine peer copy 0 -> 1.
  {
    const size_t bytes = size_t(1) << 30;
    void *a = nullptr, *b = nullptr;
    EPMOE_CUDA_CHECK(cudaSetDevice(1));
    EPMOE_CUDA_CHECK(cudaMalloc(&b, bytes));
    EPMOE_CUDA_CHECK(cudaSetDevice(0));
    EPMOE_CUDA_CHECK(cudaMalloc(&a, bytes));
    std::vector<double> ts;
    for (int i = 0; i < 6; ++i) {
      EPMOE_CUDA_CHECK(cudaEventRecord(rd[0].ev[0], rd[0].st));
      EPMOE_CUDA_CHECK(cudaMemcpyPeerAsync(b, 1, a, 0, bytes, rd[0].st));
      EPMOE_CUDA_CHECK(cudaEventRecord(rd[0].ev[1], rd[0].st));
      EPMOE_CUDA_CHECK(cudaEventSynchronize(rd[0].ev[1]));
      float ms = 0;
      EPMOE_CUDA_CHECK(cudaEventElapsedTime(&ms, rd[0].ev[0], rd[0].ev[1]));
      if (i > 0) ts.push_back(ms * 1e3);
    }
    std::printf("# copy-engine peer copy 0->1, 1 GiB: %.0f GB/s (link ceiling)\n", bytes / median(ts) / 1e3);
    cudaFree(a);
    EPMOE_CUDA_CHECK(cudaSetDevice(1));
    cudaFree(b);
  }

  std::printf("%-7s %-6s %6s | %9s %9s | %9s %9s %7s | %9s %9s | %6s %6s | %7s %7s\n", "disp", "format", "T", "disp_us",
              "comb_us", "link_MB", "logic_MB", "link/lg", "CE_us", "NCCLa2a", "CE/d", "NCCL/d", "d_GB/s", "c_GB/s");
  for (const std::string& dname : disps) {
    for (long long T : Ts) {
      for (ActFormat f : fmts) {
        MoeConfig cfg = pre.config;
        cfg.num_ranks = R;
        cfg.capacity = static_cast<int>(T);
        cfg.dispatch_format = f;
        cfg.combine_format = ActFormat::bf16;
        if (f == ActFormat::nvfp4 && cfg.nvfp4_global_scale <= 0) cfg.nvfp4_global_scale = 448.f * 6.f / 5.f;
        cfg.dispatcher = dname;
        cfg.runner = "cuda";
        cfg.comm_sms = flags.get_int("comm-sms", 24);
        cfg.placement.reset();
        Point pt;
        std::mutex mu;
        run_ranks(comms, [&](Communicator& comm) {
          const int r = comm.rank();
          EPMOE_CUDA_CHECK(cudaSetDevice(comm.device_index()));
          RankData& d = rd[r];
          auto disp = Registry::global().find_dispatcher(dname)->create(cfg, comm);
          DispatchInput di;
          di.num_tokens = T;
          di.hidden = static_cast<const bf16_raw*>(d.hidden);
          di.topk_ids = static_cast<const int32_t*>(d.ids);
          di.topk_weights = static_cast<const float*>(d.w);
          di.stream = d.st;
          CombineInput ci;
          ci.y = static_cast<const bf16_raw*>(d.y);
          ci.stream = d.st;
          // Warm-up, then `reps` steps queued back to back (no host sync in between, as in a model's
          // forward pass), each bracketed by its own events.
          std::vector<double> td, tc;
          DispatchOutput o{};
          for (int i = 0; i < 5; ++i) {
            o = disp->dispatch(di);
            disp->combine(ci, static_cast<bf16_raw*>(d.out));
          }
          detail::gpu_dispatcher_sync(*disp, d.st);
          std::vector<cudaEvent_t> ev(size_t(3) * reps);
          for (auto& e : ev) EPMOE_CUDA_CHECK(cudaEventCreate(&e));
          for (int i = 0; i < reps; ++i) {
            EPMOE_CUDA_CHECK(cudaEventRecord(ev[3 * i], d.st));
            o = disp->dispatch(di);
            EPMOE_CUDA_CHECK(cudaEventRecord(ev[3 * i + 1], d.st));
            disp->combine(ci, static_cast<bf16_raw*>(d.out));
            EPMOE_CUDA_CHECK(cudaEventRecord(ev[3 * i + 2], d.st));
          }
          detail::gpu_dispatcher_sync(*disp, d.st);
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
          EPMOE_CUDA_CHECK(cudaMemcpy(counts.data(), o.counts, R * 4, cudaMemcpyDeviceToHost));
          const double row = double(payload_bytes(f, H) + scale_bytes(f, H) + 8 * K);
          double logical = 0, link = 0, clink = 0;
          const double crow = double(payload_bytes(cfg.combine_format, H) + scale_bytes(cfg.combine_format, H));
          for (int s = 0; s < R; ++s) {
            logical += counts[s] * row;
            if (s != r) link += counts[s] * row;
            if (s != r) clink += counts[s] * crow;  // rows of other ranks' tokens go back to them
          }
          // Copy-engine peer copy of the same link bytes (rank 0 -> 1 only).
          std::vector<double> tce;
          if (r == 0) {
            tce = time_each_us(d, reps, [&] {
              EPMOE_CUDA_CHECK(cudaMemcpyPeerAsync(rd[1].peer_buf, 1, d.a2a_send, 0, size_t(link), d.st));
            });
          }
          std::lock_guard<std::mutex> lk(mu);
          if (r == 0) {
            pt.dispatch_us = median(td);
            pt.combine_us = median(tc);
            pt.ce_us = median(tce);
            pt.link_bytes = link;
            pt.logical_bytes = logical;
            pt.combine_link_bytes = clink;
          }
        });
        // NCCL all-to-all of rank 0's link bytes, the same size on every rank (p2p sizes must match).
        const size_t per_peer = R > 1 ? size_t(pt.link_bytes / (R - 1)) : 0;
        run_ranks(comms, [&](Communicator& comm) {
          const int r = comm.rank();
          EPMOE_CUDA_CHECK(cudaSetDevice(comm.device_index()));
          RankData& d = rd[r];
          ncclComm_t nc = nccl_handle(comm);
          const std::vector<double> tn = time_each_us(d, reps, [&] {
            ncclGroupStart();
            for (int p = 0; p < R; ++p) {
              if (p == r) continue;
              ncclSend(static_cast<uint8_t*>(d.a2a_send) + p * per_peer, per_peer, ncclUint8, p, nc, d.st);
              ncclRecv(static_cast<uint8_t*>(d.a2a_recv) + p * per_peer, per_peer, ncclUint8, p, nc, d.st);
            }
            ncclGroupEnd();
          });
          std::lock_guard<std::mutex> lk(mu);
          if (r == 0) pt.nccl_us = median(tn);
        });
        std::printf("%-7s %-6s %6lld | %9.1f %9.1f | %9.2f %9.2f %7.2f | %9.1f %9.1f | %6.2f %6.2f | %7.0f %7.0f\n",
                    dname.c_str(), format_name(f), T, pt.dispatch_us, pt.combine_us, pt.link_bytes / 1e6,
                    pt.logical_bytes / 1e6, pt.logical_bytes > 0 ? pt.link_bytes / pt.logical_bytes : 0.0, pt.ce_us,
                    pt.nccl_us, pt.dispatch_us > 0 ? pt.ce_us / pt.dispatch_us : 0.0,
                    pt.dispatch_us > 0 ? pt.nccl_us / pt.dispatch_us : 0.0,
                    pt.dispatch_us > 0 ? pt.link_bytes / pt.dispatch_us / 1e3 : 0.0,
                    pt.combine_us > 0 ? pt.combine_link_bytes / pt.combine_us / 1e3 : 0.0);
        std::fflush(stdout);
      }
    }
  }
  std::printf("# link_MB/logic_MB: dispatch bytes rank 0 received over NVLink / including its own tokens "
              "(payload+scales+ids+weights). CE_us: cudaMemcpyPeerAsync of link_MB; NCCLa2a: ncclSend/Recv "
              "group of link_MB per peer. CE/d, NCCL/d > 1: the dispatcher is faster than that baseline. d_GB/s, c_GB/s: "
              "NVLink bytes into rank 0 per dispatch (link_MB) / out of rank 0 per combine (its rows of other ranks' "
              "tokens, in the combine format) over the measured time.\n");
  for (auto& d : rd) {
    for (void* p : {d.hidden, d.ids, d.w, d.y, d.out, d.a2a_send, d.a2a_recv, d.peer_buf}) cudaFree(p);
  }
  return 0;
}

const BenchRegistrar reg{{"a2a", "dispatch/combine of the multi-GPU dispatchers vs copy engine and NCCL all-to-all",
                          bench_a2a}};

}  // namespace
}  // namespace epmoe::cli
#endif  // EPMOE_WITH_NCCL
