// The multi-GPU dispatchers "nccl" and "nvlink" against the cpu fabric and the oracle of
// dispatch_harness.h, bitwise: received payload/scales/ids/weights/counts/expert counts, and the
// combine sum. Needs 2 GPUs (skipped with the reason otherwise). Runs with a thread per GPU, or one
// process per GPU under mpirun (common/gpu_ranks.h), where each process checks its own rank.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "common/gpu_ranks.h"
#include "dispatch/output.h"
#include "dispatch/a2a/host.h"
#include "dispatch/dispatch_harness.h"
#include "epmoe/error.h"
#include "epmoe/nccl_comm.h"

namespace epmoe::test {
namespace {

#define CK(x) ASSERT_EQ(cudaSuccess, (x)) << #x

#define NEED_GPUS(n)                                                                                 \
  do {                                                                                               \
    const int have_ = gpu_ranks_available();                                                         \
    if (have_ < (n))                                                                                 \
      GTEST_SKIP() << "needs " << (n) << " GPU ranks, " << (tests_under_mpirun() ? "this mpirun job has " \
                                                                                 : "this machine has ")   \
                   << have_;                                                                         \
  } while (0)

std::vector<std::unique_ptr<Communicator>> group(int R, int timeout_ms = 10000) { return gpu_group(R, timeout_ms); }

// The size of the group `comms` belongs to (under mpirun `comms` holds this process's rank only).
size_t group_size(const std::vector<std::unique_ptr<Communicator>>& comms) {
  return comms.empty() ? 0 : size_t(comms[0]->size());
}

// Device copies of one rank's inputs and outputs.
struct DevRank {
  void* hidden = nullptr;
  void* ids = nullptr;
  void* w = nullptr;
  void* y = nullptr;
  void* out = nullptr;
  cudaStream_t stream = nullptr;
  ~DevRank() {
    for (void* p : {hidden, ids, w, y, out})
      if (p) cudaFree(p);
    if (stream) cudaStreamDestroy(stream);
  }
};

// The copy is complete when this returns: a pageable cudaMemcpy may return while its last DMA is in
// flight, and the dispatchers' streams are non-blocking (no implicit order with it); a combine of
// WideAndOddRowsMatchCpuFabric once raced such an upload (bench/results/history-comm.md).
template <class T>
void* upload(const std::vector<T>& v) {
  void* p = nullptr;
  if (cudaMalloc(&p, std::max<size_t>(16, v.size() * sizeof(T))) != cudaSuccess) throw std::runtime_error("cudaMalloc");
  if (!v.empty()) cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
  if (cudaDeviceSynchronize() != cudaSuccess) throw std::runtime_error("upload: cudaDeviceSynchronize");
  return p;
}

// Uploads one rank's tokens into dv (hidden, ids, weights) and returns the DispatchInput over
// them, on dv's stream.
DispatchInput upload_input(DevRank& dv, const RankInput& in) {
  dv.hidden = upload(in.hidden);
  dv.ids = upload(in.ids);
  dv.w = upload(in.weights);
  DispatchInput di;
  di.num_tokens = in.T;
  di.hidden = static_cast<const bf16_raw*>(dv.hidden);
  di.topk_ids = static_cast<const int32_t*>(dv.ids);
  di.topk_weights = static_cast<const float*>(dv.w);
  di.stream = dv.stream;
  return di;
}

Received download(const MoeConfig& cfg, const DispatchOutput& o) {
  Received r;
  const size_t slots = size_t(o.slots());
  r.payload.resize(slots * o.payload_stride());
  r.scales.resize(slots * o.scale_stride());
  r.ids.resize(slots * o.top_k);
  r.weights.resize(slots * o.top_k);
  r.counts.resize(o.num_ranks);
  r.expert_counts.resize(o.num_local_experts);
  cudaMemcpy(r.payload.data(), o.payload, r.payload.size(), cudaMemcpyDeviceToHost);
  if (o.scale_stride()) cudaMemcpy(r.scales.data(), o.scales, r.scales.size(), cudaMemcpyDeviceToHost);
  cudaMemcpy(r.ids.data(), o.local_ids, r.ids.size() * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(r.weights.data(), o.weights, r.weights.size() * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(r.counts.data(), o.counts, r.counts.size() * 4, cudaMemcpyDeviceToHost);
  if (o.expert_counts) cudaMemcpy(r.expert_counts.data(), o.expert_counts, r.expert_counts.size() * 4, cudaMemcpyDeviceToHost);
  (void)cfg;
  return r;
}

// A host DispatchOutput over a Received copy (for fake_run).
DispatchOutput host_view(const MoeConfig& cfg, const Received& r) {
  return detail::make_dispatch_output(cfg, DeviceKind::cpu,
                                      {r.payload.data(), r.scales.data(), r.ids.data(), r.weights.data(),
                                       r.counts.data(), r.expert_counts.data()});
}

// One dispatch + fake run + combine on the cpu fabric: what each rank received and its output.
struct RoundTrip {
  std::vector<Received> recv;
  std::vector<std::vector<bf16_raw>> out;
};

RoundTrip cpu_round_trip(MoeConfig cfg, const std::vector<RankInput>& in) {
  cfg.dispatcher = "cpu";
  cfg.runner = "reference";  // the legal pair for the fabric; the runner is not used here
  RoundTrip rt;
  rt.recv.resize(cfg.num_ranks);
  rt.out.resize(cfg.num_ranks);
  auto comms = make_cpu_group(cfg.num_ranks, cfg.timeout_ms);
  run_ranks(comms, [&](Communicator& comm) {
    const int r = comm.rank();
    auto disp = create_dispatcher(cfg, comm);
    const DispatchOutput o = disp->dispatch(in[r].view());
    rt.recv[r] = snapshot(o);
    const std::vector<bf16_raw> y = fake_run(cfg, o, r);
    rt.out[r].assign(size_t(in[r].T) * cfg.hidden, 0xdead);
    CombineInput ci;
    ci.y = y.data();
    disp->combine(ci, rt.out[r].data());
  });
  return rt;
}

// The same on GPU dispatchers `disps` (one per rank, already created on `comms`).
RoundTrip gpu_round_trip(const MoeConfig& cfg, std::vector<std::unique_ptr<Communicator>>& comms,
                         std::vector<std::unique_ptr<Dispatcher>>& disps, const std::vector<RankInput>& in) {
  RoundTrip rt;
  rt.recv.resize(cfg.num_ranks);
  rt.out.resize(cfg.num_ranks);
  run_ranks(comms, [&](Communicator& comm) {
    const int r = comm.rank();
    cudaSetDevice(comm.device_index());
    DevRank dv;
    cudaStreamCreateWithFlags(&dv.stream, cudaStreamNonBlocking);
    const DispatchInput di = upload_input(dv, in[r]);
    const DispatchOutput o = disps[r]->dispatch(di);
    detail::gpu_dispatcher_sync(*disps[r], dv.stream);
    rt.recv[r] = download(cfg, o);
    const std::vector<bf16_raw> y = fake_run(cfg, host_view(cfg, rt.recv[r]), r);
    dv.y = upload(y);
    std::vector<bf16_raw> poison(size_t(in[r].T) * cfg.hidden, 0xdead);
    dv.out = upload(poison);
    CombineInput ci;
    ci.y = static_cast<const bf16_raw*>(dv.y);
    ci.stream = dv.stream;
    disps[r]->combine(ci, static_cast<bf16_raw*>(dv.out));
    detail::gpu_dispatcher_sync(*disps[r], dv.stream);
    rt.out[r].resize(poison.size());
    cudaMemcpy(rt.out[r].data(), dv.out, poison.size() * 2, cudaMemcpyDeviceToHost);
  });
  return rt;
}

std::vector<std::unique_ptr<Dispatcher>> create_all(const MoeConfig& cfg, std::vector<std::unique_ptr<Communicator>>& comms) {
  std::vector<std::unique_ptr<Dispatcher>> d(group_size(comms));
  run_ranks(comms, [&](Communicator& c) {
    d[c.rank()] = Registry::global().find_dispatcher(cfg.dispatcher)->create(cfg, c);
  });
  return d;
}

void expect_same(const MoeConfig& cfg, const std::vector<RankInput>& in, const RoundTrip& gpu, const std::string& ctx) {
  const RoundTrip cpu = cpu_round_trip(cfg, in);
  for (int r = 0; r < cfg.num_ranks; ++r) {
    if (!is_local_rank(r)) continue;
    expect_received(cfg, cpu.recv[r], gpu.recv[r], ctx + " rank " + std::to_string(r) + " vs cpu fabric");
    expect_received(cfg, expected_receive(cfg, in, r), gpu.recv[r], ctx + " rank " + std::to_string(r) + " vs oracle");
    ASSERT_EQ(cpu.out[r].size(), gpu.out[r].size());
    EXPECT_TRUE(cpu.out[r] == gpu.out[r]) << ctx << " combine output of rank " << r << " differs from the cpu fabric";
    EXPECT_TRUE(expected_combine(cfg, in, r) == gpu.out[r]) << ctx << " combine output of rank " << r << " vs oracle";
  }
}

// Runs fn on every rank; each rank's UsageError message, "" where fn returned normally.
std::vector<std::string> usage_errors(std::vector<std::unique_ptr<Communicator>>& comms,
                                      const std::function<void(Communicator&)>& fn) {
  std::vector<std::string> msgs(group_size(comms));
  run_ranks(comms, [&](Communicator& comm) {
    try {
      fn(comm);
    } catch (const UsageError& e) {
      msgs[comm.rank()] = e.what();
    }
  });
  return msgs;
}

// The ranks (of 2) that token t of rank r goes to: what a combine of y = 1 everywhere sums.
int ranks_reached(const MoeConfig& cfg, const RankInput& in, int r, int64_t t) {
  int n = 0;
  for (int d = 0; d < 2; ++d) {
    bool goes = false;
    for (int k = 0; k < cfg.top_k; ++k) {
      const int e = in.ids[t * cfg.top_k + k];
      if (e >= 0 && oracle_copy(cfg, e, r, t).rank == d) goes = true;
    }
    n += goes;
  }
  return n;
}

MoeConfig small_config(const std::string& dispatcher, ActFormat f, ActFormat cf, int C = 96) {
  MoeConfig cfg = make_config(2, 16, 4, 256, C, f, cf);
  cfg.dispatcher = dispatcher;
  cfg.runner = "cuda";
  cfg.tuning.comm_sms = 8;
  return cfg;
}

struct Case {
  std::string dispatcher;
  ActFormat f, cf;
};
// What CTest shows next to the test name (instead of the parameter's raw bytes).
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.dispatcher << " dispatch " << format_name(c.f) << " combine " << format_name(c.cf);
}

class GpuA2A : public ::testing::TestWithParam<Case> {};

std::string case_name(const ::testing::TestParamInfo<Case>& i) {
  return i.param.dispatcher + "_" + format_name(i.param.f) + "_combine_" + format_name(i.param.cf);
}

// Round trips of several traffic shapes (some ranks with no tokens, full capacity, one token) on
// one group and one dispatcher per rank, each against the cpu fabric.
void expect_traffic_shapes(const MoeConfig& cfg, uint32_t seed, const std::string& label) {
  auto comms = group(2);
  auto disps = create_all(cfg, comms);
  const std::vector<std::vector<int64_t>> shapes = {{37, 50}, {0, 61}, {96, 1}, {0, 0}, {96, 96}, {5, 0}};
  for (const auto& T : shapes) {
    const auto in = random_inputs(cfg, T, seed++);
    expect_same(cfg, in, gpu_round_trip(cfg, comms, disps, in),
                label + " T={" + std::to_string(T[0]) + "," + std::to_string(T[1]) + "}");
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// Every pair and format, with several shapes of traffic.
TEST_P(GpuA2A, MatchesCpuFabricBitwise) {
  NEED_GPUS(2);
  const Case c = GetParam();
  expect_traffic_shapes(small_config(c.dispatcher, c.f, c.cf), 11, c.dispatcher);
}

INSTANTIATE_TEST_SUITE_P(
    NcclNvlink, GpuA2A,
    ::testing::Values(Case{"nccl", ActFormat::bf16, ActFormat::bf16}, Case{"nccl", ActFormat::fp8, ActFormat::bf16},
                      Case{"nccl", ActFormat::nvfp4, ActFormat::fp8}, Case{"nccl", ActFormat::fp8, ActFormat::fp8},
                      Case{"nvlink", ActFormat::bf16, ActFormat::bf16}, Case{"nvlink", ActFormat::fp8, ActFormat::bf16},
                      Case{"nvlink", ActFormat::nvfp4, ActFormat::fp8}, Case{"nvlink", ActFormat::fp8, ActFormat::fp8},
                      Case{"nvlink", ActFormat::nvfp4, ActFormat::bf16}),
    case_name);

// All of rank 0's tokens go to rank 1, rank 1 sends one token: very unbalanced traffic.
TEST(NcclNvlinkDispatch, VeryUnbalancedRanks) {
  NEED_GPUS(2);
  auto comms = group(2);
  for (const char* name : {"nccl", "nvlink"}) {
    MoeConfig cfg = small_config(name, ActFormat::fp8, ActFormat::bf16, 128);
    auto in = random_inputs(cfg, {128, 1}, 5, 0.0);
    for (auto& id : in[0].ids) id = 8 + (id % 8);  // experts 8..15 live on rank 1
    auto disps = create_all(cfg, comms);
    expect_same(cfg, in, gpu_round_trip(cfg, comms, disps, in), std::string(name) + " unbalanced");
  }
}

// Redundant copies: some experts on both ranks; the placement rule decides per token.
TEST(NcclNvlinkDispatch, ExplicitPlacementWithRedundantCopies) {
  NEED_GPUS(2);
  auto comms = group(2);
  for (const char* name : {"nccl", "nvlink"}) {
    MoeConfig cfg = small_config(name, ActFormat::bf16, ActFormat::bf16);
    std::vector<std::vector<ExpertCopy>> copies(16);
    for (int e = 0; e < 16; ++e) copies[e].push_back({e / 8, e % 8});
    copies[3].push_back({1, 8});
    copies[12].push_back({0, 8});
    copies[5].push_back({1, 9});
    cfg.placement = ExpertPlacement::explicit_map(2, 10, copies);
    auto disps = create_all(cfg, comms);
    const auto in = random_inputs(cfg, {70, 33}, 21);
    expect_same(cfg, in, gpu_round_trip(cfg, comms, disps, in), std::string(name) + " explicit placement");
  }
}

// The library restores the calling thread's current device: making the group, the dispatchers,
// a round trip and tearing them all down on this thread leave it on the device it chose (a
// PyTorch process keeps its own). Before, the last communicator or dispatcher destroyed left its
// own device current, and the next single-GPU allocation landed on the wrong GPU.
TEST(NcclNvlinkDispatch, CallersDeviceIsLeftAlone) {
  NEED_GPUS(2);
  for (int mine : {1, 0}) {
    ASSERT_EQ(cudaSetDevice(mine), cudaSuccess);
    {
      auto comms = group(2);
      for (const char* name : {"nccl", "nvlink"}) {
        MoeConfig cfg = small_config(name, ActFormat::fp8, ActFormat::bf16, 32);
        auto disps = create_all(cfg, comms);
        const auto in = random_inputs(cfg, {20, 7}, 5);
        expect_same(cfg, in, gpu_round_trip(cfg, comms, disps, in), std::string(name) + " device scope");
        int cur = -1;
        ASSERT_EQ(cudaGetDevice(&cur), cudaSuccess);
        EXPECT_EQ(cur, mine) << name << ": after creation and a round trip";
      }
    }
    int cur = -1;
    ASSERT_EQ(cudaGetDevice(&cur), cudaSuccess);
    EXPECT_EQ(cur, mine) << "after the communicators and dispatchers were destroyed";
  }
}

// T > C on one rank and a bad id on the other: every rank raises the same UsageError, nothing is
// sent, and the dispatcher keeps working afterwards.
TEST(NcclNvlinkDispatch, CapacityAndBadIdErrorsOnEveryRank) {
  NEED_GPUS(2);
  auto comms = group(2);
  for (const char* name : {"nccl", "nvlink"}) {
    MoeConfig cfg = small_config(name, ActFormat::fp8, ActFormat::bf16, 32);
    auto disps = create_all(cfg, comms);
    for (int which = 0; which < 2; ++which) {
      auto in = random_inputs(cfg, {which == 0 ? 33 : 20, 20}, 3);
      if (which == 1) in[1].ids[7 * cfg.top_k + 2] = 16;  // E = 16: out of range
      const std::vector<std::string> msgs = usage_errors(comms, [&](Communicator& comm) {
        const int r = comm.rank();
        cudaSetDevice(comm.device_index());
        DevRank dv;
        const DispatchInput di = upload_input(dv, in[r]);  // default stream
        disps[r]->dispatch(di);
        detail::gpu_dispatcher_sync(*disps[r], nullptr);
      });
      for (int r = 0; r < 2; ++r) {
        if (!is_local_rank(r)) continue;
        if (which == 0) {
          EXPECT_NE(msgs[r].find("rank 0: T=33 tokens exceeds capacity C=32"), std::string::npos) << name << ": " << msgs[r];
        } else {
          EXPECT_NE(msgs[r].find("rank 1: topk_ids[token 7, k 2] = 16"), std::string::npos) << name << ": " << msgs[r];
        }
        EXPECT_NE(msgs[r].find("nothing was sent"), std::string::npos) << msgs[r];
      }
      // Still usable.
      const auto good = random_inputs(cfg, {32, 17}, 99);
      expect_same(cfg, good, gpu_round_trip(cfg, comms, disps, good), std::string(name) + " after an error");
    }
  }
}

// Ranks created with different configurations fail at setup on every rank.
TEST(NcclNvlinkDispatch, MismatchedConfigurationIsAnError) {
  NEED_GPUS(2);
  auto comms = group(2);
  for (const char* name : {"nccl", "nvlink"}) {
    const std::vector<std::string> msgs = usage_errors(comms, [&](Communicator& c) {
      MoeConfig cfg = small_config(name, ActFormat::bf16, ActFormat::bf16, c.rank() == 0 ? 64 : 65);
      Registry::global().find_dispatcher(name)->create(cfg, c);
    });
    for (int r = 0; r < 2; ++r)
      if (is_local_rank(r))
        EXPECT_NE(msgs[r].find("differs between ranks"), std::string::npos) << name << ": " << msgs[r];
  }
}

// Communicators the caller created (ncclCommInitAll) and epmoe adopted (adopt_nccl_comm) carry
// both dispatchers like epmoe's own; the caller destroys them afterwards.
TEST(NcclNvlinkDispatch, AdoptedCommunicatorsMatchCpuFabric) {
  NEED_GPUS(2);
  if (tests_under_mpirun()) GTEST_SKIP() << "creates its own communicators over GPUs 0 and 1; one process only";
  setenv("NCCL_NVLS_ENABLE", "0", 1);  // as nccl_comm.h asks of a caller that creates its own
  struct Raw {
    ncclComm_t c[2] = {nullptr, nullptr};
    ~Raw() {
      for (ncclComm_t x : c)
        if (x) ncclCommDestroy(x);
    }
  } raw;
  int devs[2] = {0, 1};
  ASSERT_EQ(ncclSuccess, ncclCommInitAll(raw.c, 2, devs));
  std::vector<std::unique_ptr<Communicator>> comms;
  for (ncclComm_t c : raw.c) comms.push_back(adopt_nccl_comm(c));
  for (const char* name : {"nccl", "nvlink"}) {
    const MoeConfig cfg = small_config(name, ActFormat::fp8, ActFormat::bf16);
    auto disps = create_all(cfg, comms);
    const auto in = random_inputs(cfg, {37, 50}, 31);
    expect_same(cfg, in, gpu_round_trip(cfg, comms, disps, in), std::string(name) + " on adopted communicators");
  }
}

// 1000 back-to-back steps with changing token counts; every 100th is checked against the fabric,
// and the last one after all 1000 ran without a host sync in between (nvlink).
TEST(NcclNvlinkDispatch, ThousandBackToBackCalls) {
  NEED_GPUS(2);
  auto comms = group(2);
  for (const char* name : {"nvlink", "nccl"}) {
    MoeConfig cfg = small_config(name, ActFormat::fp8, ActFormat::bf16, 64);
    auto disps = create_all(cfg, comms);
    std::vector<std::vector<RankInput>> ins;
    for (int i = 0; i < 4; ++i) ins.push_back(random_inputs(cfg, {int64_t(64 - 13 * i), int64_t(7 * i)}, 500 + i));
    std::vector<std::vector<bf16_raw>> outs(2);
    run_ranks(comms, [&](Communicator& comm) {
      const int r = comm.rank();
      cudaSetDevice(comm.device_index());
      std::vector<std::unique_ptr<DevRank>> dv(4);
      std::vector<DispatchInput> di(4);
      cudaStream_t st;
      cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
      void* y = upload(std::vector<bf16_raw>(size_t(2) * cfg.capacity * cfg.hidden, num::f32_to_bf16(0.5f)));
      for (int i = 0; i < 4; ++i) {
        dv[i] = std::make_unique<DevRank>();
        di[i] = upload_input(*dv[i], ins[i][r]);
        di[i].stream = st;  // all four inputs go on one stream
        dv[i]->out = upload(std::vector<bf16_raw>(size_t(64) * cfg.hidden));
      }
      for (int it = 0; it < 1000; ++it) {
        const int i = it % 4;
        disps[r]->dispatch(di[i]);
        CombineInput ci;
        ci.y = static_cast<const bf16_raw*>(y);
        ci.stream = st;
        disps[r]->combine(ci, static_cast<bf16_raw*>(dv[i]->out));
      }
      detail::gpu_dispatcher_sync(*disps[r], st);
      outs[r].resize(size_t(ins[3][r].T) * cfg.hidden);
      cudaMemcpy(outs[r].data(), dv[3]->out, outs[r].size() * 2, cudaMemcpyDeviceToHost);
      cudaFree(y);
      cudaStreamDestroy(st);
    });
    // Step 999 used input 3 with y = 0.5 everywhere: out[t] = 0.5 * (number of ranks t went to).
    const auto& in = ins[3];
    for (int r = 0; r < 2; ++r)
      for (int64_t t = 0; is_local_rank(r) && t < in[r].T; ++t) {
        const int n = ranks_reached(cfg, in[r], r, t);
        ASSERT_EQ(num::f32_to_bf16(0.5f * n), outs[r][t * cfg.hidden]) << name << " rank " << r << " token " << t;
        ASSERT_EQ(num::f32_to_bf16(0.5f * n), outs[r][t * cfg.hidden + cfg.hidden - 1]) << name;
      }
    // And a full bitwise check right after the 1000 calls.
    const auto in2 = random_inputs(cfg, {40, 64}, 77);
    expect_same(cfg, in2, gpu_round_trip(cfg, comms, disps, in2), std::string(name) + " after 1000 calls");
  }
}

// nvlink: dispatch + a device-side stand-in runner + combine captured in one CUDA graph per rank and
// replayed; the replays must give the fabric's result (epochs live in device memory).
// A captured dispatch + combine replayed 50 times, then eager calls, against the fabric.
void expect_graph_replay(const MoeConfig& cfg) {
  auto comms = group(2);
  auto disps = create_all(cfg, comms);
  const auto in = random_inputs(cfg, {64, 29}, 1234);
  // Reference: y = 1.0 for every slot (a constant runner that a graph can hold as a memcpy).
  std::vector<std::vector<bf16_raw>> outs(2);
  std::vector<std::string> errs(2);
  run_ranks(comms, [&](Communicator& comm) {
    const int r = comm.rank();
    cudaSetDevice(comm.device_index());
    DevRank dv;
    cudaStreamCreateWithFlags(&dv.stream, cudaStreamNonBlocking);
    const DispatchInput di = upload_input(dv, in[r]);
    dv.y = upload(std::vector<bf16_raw>(size_t(2) * cfg.capacity * cfg.hidden, num::f32_to_bf16(1.0f)));
    dv.out = upload(std::vector<bf16_raw>(size_t(in[r].T) * cfg.hidden, 0xdead));
    CombineInput ci;
    ci.y = static_cast<const bf16_raw*>(dv.y);
    ci.stream = dv.stream;
    cudaGraph_t g;
    cudaGraphExec_t ge;
    if (cudaStreamBeginCapture(dv.stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
      errs[r] = "begin capture failed";
      return;
    }
    disps[r]->dispatch(di);
    disps[r]->combine(ci, static_cast<bf16_raw*>(dv.out));
    if (cudaStreamEndCapture(dv.stream, &g) != cudaSuccess || cudaGraphInstantiate(&ge, g, 0) != cudaSuccess) {
      errs[r] = "capture failed";
      return;
    }
    for (int i = 0; i < 50; ++i) cudaGraphLaunch(ge, dv.stream);
    detail::gpu_dispatcher_sync(*disps[r], dv.stream);
    outs[r].resize(size_t(in[r].T) * cfg.hidden);
    cudaMemcpy(outs[r].data(), dv.out, outs[r].size() * 2, cudaMemcpyDeviceToHost);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
  });
  for (int r = 0; r < 2; ++r) {
    if (!is_local_rank(r)) continue;
    ASSERT_EQ("", errs[r]);
    for (int64_t t = 0; t < in[r].T; ++t) {
      const int n = ranks_reached(cfg, in[r], r, t);
      for (int h = 0; h < cfg.hidden; h += 37)
        ASSERT_EQ(num::f32_to_bf16(float(n)), outs[r][t * cfg.hidden + h]) << "rank " << r << " token " << t;
    }
  }
  // Eager calls after 50 replays still agree with the fabric.
  const auto in2 = random_inputs(cfg, {12, 64}, 4321);
  expect_same(cfg, in2, gpu_round_trip(cfg, comms, disps, in2), "nvlink after graph replays");
}

TEST(NvlinkDispatch, CudaGraphReplay) {
  NEED_GPUS(2);
  expect_graph_replay(small_config("nvlink", ActFormat::bf16, ActFormat::bf16, 64));
}

// A bad value of a tuning option is a UsageError naming it, on every rank (no hang).
TEST(NvlinkDispatch, BadTuningOptionIsAUsageError) {
  NEED_GPUS(2);
  auto comms = group(2);
  const auto set_ce_rows = [](MoeConfig& c) { c.tuning.ce_rows = 0; };
  const auto set_push_warps = [](MoeConfig& c) { c.tuning.push_warps = 13; };
  const auto set_comm_sms = [](MoeConfig& c) { c.tuning.comm_sms = Tuning::kMaxCommSms; };  // > the device's SMs
  for (const auto& [name, set] : std::vector<std::pair<const char*, std::function<void(MoeConfig&)>>>{
           {"tuning.ce_rows", set_ce_rows}, {"tuning.push_warps", set_push_warps}, {"tuning.comm_sms", set_comm_sms}}) {
    MoeConfig cfg = small_config("nvlink", ActFormat::bf16, ActFormat::bf16);
    set(cfg);
    const std::vector<std::string> msgs = usage_errors(comms, [&](Communicator& c) {
      Registry::global().find_dispatcher("nvlink")->create(cfg, c);
    });
    for (int r = 0; r < 2; ++r)
      if (is_local_rank(r)) EXPECT_NE(msgs[r].find(name), std::string::npos) << name << ": " << msgs[r];
  }
}

// The copy-engine combine (tuning.combine = ce): whole regions copied 32 rows at a time (so a
// region of 96 slots spans three copies and three flags), the same bytes as the cpu fabric for
// every traffic shape, and under graph replay.
TEST(NvlinkDispatch, CopyEngineCombineMatchesCpuFabric) {
  NEED_GPUS(2);
  const auto ce = [](MoeConfig c) {
    c.tuning.combine = CombineMode::ce;
    c.tuning.ce_rows = 32;
    return c;
  };
  expect_traffic_shapes(ce(small_config("nvlink", ActFormat::fp8, ActFormat::bf16)), 77, "ce combine");
  if (HasFatalFailure()) return;
  expect_graph_replay(ce(small_config("nvlink", ActFormat::bf16, ActFormat::bf16, 64)));
}

// nvlink round trips vs the cpu fabric, for each shape on one dispatcher of capacity 700 (E 32,
// K 8): a row width, dispatch and combine formats, a grid size and the token counts of each step.
struct NvlinkShape {
  int H;
  ActFormat f, cf;
  int sms;
  std::vector<std::vector<int64_t>> T;
};
void expect_nvlink_shapes(const std::vector<NvlinkShape>& shapes, uint32_t seed, const std::string& label) {
  auto comms = group(2);
  for (const NvlinkShape& sh : shapes) {
    MoeConfig cfg = make_config(2, 32, 8, sh.H, 700, sh.f, sh.cf);
    cfg.dispatcher = "nvlink";
    cfg.runner = "cuda";
    cfg.tuning.comm_sms = sh.sms;
    auto disps = create_all(cfg, comms);
    for (const auto& T : sh.T) {
      const auto in = random_inputs(cfg, T, seed++);
      const std::string ctx = label + " H=" + std::to_string(sh.H) + " " + format_name(sh.f) + "/" +
                              format_name(sh.cf) + " T={" + std::to_string(T[0]) + "," + std::to_string(T[1]) + "}";
      expect_same(cfg, in, gpu_round_trip(cfg, comms, disps, in), ctx);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

// nvlink: rows of DeepSeek-V3 width (7 units of 1024 elements per row, several units per token in
// flight, more tokens than one CTA's slot pass) and widths that end inside a unit (H % 1024 != 0),
// with fp8 rows ending on a partial 128-block (gpt-oss's 2880 = 22.5 blocks, 1344 = 10.5), each with
// two steps on one dispatcher so that stale slots of the first step must read -1. Widths stay
// multiples of 64: a configuration naming runner cuda is refused otherwise, so narrower alignments
// never reach the dispatcher.
TEST(NvlinkDispatch, WideAndOddRowsMatchCpuFabric) {
  NEED_GPUS(2);
  expect_nvlink_shapes({{7168, ActFormat::fp8, ActFormat::bf16, 24, {{700, 513}, {64, 700}}},
                        {7168, ActFormat::bf16, ActFormat::bf16, 24, {{300, 0}, {17, 299}}},
                        {7168, ActFormat::nvfp4, ActFormat::fp8, 24, {{257, 300}, {300, 3}}},
                        {1152, ActFormat::fp8, ActFormat::fp8, 5, {{333, 700}, {700, 1}}},
                        {1088, ActFormat::nvfp4, ActFormat::bf16, 7, {{700, 650}, {20, 700}}},
                        {1216, ActFormat::bf16, ActFormat::bf16, 3, {{700, 699}, {1, 2}}},
                        {2880, ActFormat::fp8, ActFormat::fp8, 24, {{700, 300}, {5, 700}}},
                        {1344, ActFormat::fp8, ActFormat::fp8, 5, {{333, 700}, {700, 1}}}},
                       900, "nvlink");
}

// nvlink: comm_sms is local tuning (not part of the configuration fingerprint), so ranks may launch
// different grids; arrivals are counted per source with the grid size each source announces.
TEST(NvlinkDispatch, RanksWithDifferentCommSms) {
  NEED_GPUS(2);
  auto comms = group(2);
  MoeConfig cfg = small_config("nvlink", ActFormat::fp8, ActFormat::bf16, 96);
  std::vector<std::unique_ptr<Dispatcher>> disps(2);
  run_ranks(comms, [&](Communicator& c) {
    MoeConfig mine = cfg;
    mine.tuning.comm_sms = c.rank() == 0 ? 11 : 2;
    disps[c.rank()] = Registry::global().find_dispatcher("nvlink")->create(mine, c);
  });
  uint32_t seed = 4000;
  for (const std::vector<int64_t>& T : {std::vector<int64_t>{96, 5}, {0, 96}, {40, 41}}) {
    const auto in = random_inputs(cfg, T, seed++);
    expect_same(cfg, in, gpu_round_trip(cfg, comms, disps, in), "nvlink comm_sms 11/2");
    if (HasFatalFailure()) return;
  }
}

// nvlink: a rank that never dispatches is named in a TimeoutError instead of a hang.
TEST(NvlinkDispatch, MissingPeerIsNamedInTimeout) {
  NEED_GPUS(2);
  if (tests_under_mpirun()) GTEST_SKIP() << "simulates the missing rank with a thread that does not call; one process only";
  auto comms = group(2, 3000);
  MoeConfig cfg = small_config("nvlink", ActFormat::bf16, ActFormat::bf16, 32);
  cfg.timeout_ms = 300;
  auto disps = create_all(cfg, comms);
  const auto in = random_inputs(cfg, {10, 10}, 8);
  int missing = -2;
  std::string msg;
  const auto t0 = std::chrono::steady_clock::now();
  run_ranks(comms, [&](Communicator& comm) {
    if (comm.rank() != 0) return;  // rank 1 never comes
    cudaSetDevice(comm.device_index());
    DevRank dv;
    const DispatchInput di = upload_input(dv, in[0]);  // default stream
    try {
      disps[0]->dispatch(di);
      detail::gpu_dispatcher_sync(*disps[0], nullptr);
    } catch (const TimeoutError& e) {
      missing = e.rank();
      msg = e.what();
    }
  });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(1, missing) << msg;
  EXPECT_NE(msg.find("rank 1 did not arrive"), std::string::npos) << msg;
  EXPECT_LT(s, 5.0);
}

}  // namespace
}  // namespace epmoe::test
