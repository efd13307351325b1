// The "nccl" dispatcher: host-orchestrated, works over any NCCL transport (NVLink, PCIe, network).
//   dispatch  1. on the GPU: validate ids and count this rank's tokens per destination (per chunk),
//                then a one-warp kernel folds them into this rank's header (status, bad id, counts);
//             2. all_gather the headers on the GPU, one copy to the host and one bounded wait, so
//                every rank raises the same UsageError before any payload moves;
//             3. on the GPU: deterministic slots (prefix sums per chunk), then the quantized copies
//                packed per destination by ~32 warps per SM (rows split into parts when tokens are
//                few); ncclSend/ncclRecv of payload, scales, ids and weights in one group;
//             4. expert counts of the received slots.
//   combine   each region [s] of y (n[s] valid rows, contiguous) goes back to rank s as is (bf16) or
//             fp8-encoded; the home rank sums in ascending rank order (combine/reduce.h's rule).
// Host synchronisation: once per dispatch (after the header all_gather: the host needs the counts
// to size the sends); combine does not wait.
#include <climits>
#include <cstring>
#include <string>
#include <vector>

#include "core/cuda/check.h"
#include "comm/nccl/nccl_comm_impl.h"
#include "dispatch/a2a/host.h"
#include "dispatch/a2a/kernels.cuh"
#include "dispatch/check.h"
#include "dispatch/output.h"
#include "epmoe/error.h"

namespace epmoe::detail {
namespace {

constexpr int kMaxPlanCtas = 128;
using namespace input;
// Header exchanged per dispatch: the input record (check_codes.h), then R counts.
constexpr int kHeader = kRecordInts;

// This rank's header from the device's view: the host-known status `code` and its `value` (kOk
// unless T or the inputs were rejected on the host), the first bad (token, k) and its id from
// count_kernel's `bad` (which it then resets to INT_MAX for the next dispatch), and the
// per-destination counts summed over the G chunks. One warp.
__global__ void header_kernel(int32_t code, int32_t value, int32_t T, int G, int R, int K, const int32_t* chunk_counts,
                              int* bad, const int32_t* ids, int32_t* header) {
  const int lane = threadIdx.x;
  if (lane == 0) {
    int32_t c = code, bt = 0, bk = 0, bid = value;
    if (c == kOk && G > 0) {
      const int b = *bad;
      if (b != INT_MAX) {
        c = kBadId;
        bt = b / K;
        bk = b % K;
        bid = ids[b];
        *bad = INT_MAX;
      }
    }
    header[kRecCode] = c;
    header[kRecTokens] = T;
    header[kRecToken] = bt;
    header[kRecK] = bk;
    header[kRecValue] = bid;
  }
  for (int d = lane; d < R; d += 32) {
    int32_t n = 0;
    if (code == kOk)
      for (int b = 0; b < G; ++b) n += chunk_counts[size_t(b) * R + d];
    header[kHeader + d] = n;
  }
}

class NcclDispatcher final : public GpuA2aDispatcher {
 public:
  NcclDispatcher(const MoeConfig& cfg, Communicator& c)
      : cfg_(cfg), comm_(as_nccl(c, "dispatcher \"nccl\"")), R_(cfg.num_ranks), me_(c.rank()) {
    const auto dev = comm_.activate();  // first: validate() checks this device
    check_gpu_a2a_config(cfg, c.size(), c.rank(), "dispatcher \"nccl\"");
    // Before any collective allocation: ranks built differently must fail here, not hang.
    comm_.check_same(config_fingerprint(cfg), "dispatcher \"nccl\" configuration (config_fingerprint)");
    placement_ = std::make_unique<DevicePlacement>(cfg);
    const int C = cfg.capacity, H = cfg.hidden, K = cfg.top_k;
    const ActFormat f = cfg.dispatch_format, cf = cfg.combine_format;
    ps_ = payload_bytes(f, H);
    ss_ = scale_bytes(f, H);
    cps_ = payload_bytes(cf, H);
    css_ = scale_bytes(cf, H);
    const size_t slots = size_t(R_) * C;
    for (Region* r : {&send_, &recv_}) {
      r->payload.reserve(slots * ps_);
      r->scales.reserve(std::max<size_t>(16, slots * ss_));
      r->ids.reserve(slots * K * 4);
      r->weights.reserve(slots * K * 4);
    }
    EPMOE_CUDA_CHECK(cudaMemset(recv_.ids.get(), 0xff, slots * K * 4));
    chunk_counts_.reserve(size_t(kMaxPlanCtas) * R_ * 4);
    EPMOE_CUDA_CHECK(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, comm_.device_index()));
    bad_.reserve(4);
    {
      const int big = INT_MAX;  // header_kernel keeps this invariant between dispatches
      EPMOE_CUDA_CHECK(cudaMemcpy(bad_.get(), &big, 4, cudaMemcpyHostToDevice));
    }
    header_dev_.reserve(size_t(kHeader + R_) * 4);
    all_dev_.reserve(size_t(R_) * (kHeader + R_) * 4);
    slot_map_.reserve(size_t(C) * R_ * 4);
    counts_.reserve(size_t(R_) * 4);
    EPMOE_CUDA_CHECK(cudaMemset(counts_.get(), 0, size_t(R_) * 4));
    expert_counts_.reserve(std::max<size_t>(4, size_t(cfg.experts_per_rank()) * 4));
    comb_send_payload_.reserve(cf == ActFormat::bf16 ? 16 : slots * cps_);
    comb_send_scales_.reserve(std::max<size_t>(16, slots * css_));
    comb_recv_payload_.reserve(slots * cps_);
    comb_recv_scales_.reserve(std::max<size_t>(16, slots * css_));
    // Pinned: [R][kHeader + R] all-gathered headers, then R counts for the runner.
    EPMOE_CUDA_CHECK(cudaMallocHost(&host_, size_t(R_) * (kHeader + R_) * 4 + size_t(R_) * 4));
    host_all_ = static_cast<int32_t*>(host_);
    host_counts_ = host_all_ + size_t(R_) * (kHeader + R_);
    send_counts_.assign(R_, 0);
    recv_counts_.assign(R_, 0);
    EPMOE_CUDA_CHECK(cudaDeviceSynchronize());
  }

  ~NcclDispatcher() override {
    const cuda::DeviceGuard dev(comm_.device_index(), std::nothrow);
    cudaDeviceSynchronize();
    if (host_) cudaFreeHost(host_);
  }

  const char* name() const override { return "nccl"; }

  DispatchOutput dispatch(const DispatchInput& in) override {
    const auto dev = comm_.activate();
    have_dispatch_ = false;
    cudaStream_t st = static_cast<cudaStream_t>(in.stream);
    const int C = cfg_.capacity, H = cfg_.hidden, K = cfg_.top_k, E = cfg_.num_experts;
    const int64_t T = in.num_tokens;

    // 1. Local validation and counts, and this rank's header, on the device.
    const InputProblem local = check_input_shape(T, C, in.hidden, in.topk_ids, in.topk_weights);
    const int32_t code = local.code;
    const int G = plan_ctas(T, kMaxPlanCtas);
    const int64_t chunk = T > 0 ? (T + G - 1) / G : 0;
    const bool counted = code == kOk && T > 0;
    if (counted) {
      a2a::count_kernel<<<G, a2a::kCountThreads, 0, st>>>(placement_->get(), in.topk_ids, K, me_, T, chunk,
                                                          chunk_counts_.get<int32_t>(), bad_.get<int>());
      EPMOE_CUDA_CHECK_LAUNCH();
    }
    header_kernel<<<1, 32, 0, st>>>(code, local.value, static_cast<int32_t>(T), counted ? G : 0, R_, K, chunk_counts_.get<int32_t>(),
                                    bad_.get<int>(), in.topk_ids, header_dev_.get<int32_t>());
    EPMOE_CUDA_CHECK_LAUNCH();

    // 2. Everyone learns everyone's counts, or everyone's errors: one all_gather on the stream, one
    //    copy to pinned memory, one bounded wait (a rank that never arrives is named there).
    EPMOE_NCCL_CHECK(ncclAllGather(header_dev_.get(), all_dev_.get(), size_t(kHeader + R_), ncclInt32, comm_.handle(), st));
    EPMOE_CUDA_CHECK(cudaMemcpyAsync(host_all_, all_dev_.get(), size_t(R_) * (kHeader + R_) * 4, cudaMemcpyDeviceToHost, st));
    comm_.wait(st, "dispatch/counts");
    const int32_t* all = host_all_;
    std::vector<std::string> problems(R_);
    for (int r = 0; r < R_; ++r)
      problems[r] = input_message(decode_input_record(&all[size_t(r) * (kHeader + R_)]), r, C, E);
    const std::string rejected = rejected_dispatch(problems);
    if (!rejected.empty()) throw UsageError(rejected);
    for (int r = 0; r < R_; ++r) {
      send_counts_[r] = all[size_t(me_) * (kHeader + R_) + kHeader + r];
      recv_counts_[r] = all[size_t(r) * (kHeader + R_) + kHeader + me_];
    }
    T_ = T;

    // 3. Pack and exchange.
    a2a::DestTable table{};
    for (int d = 0; d < R_; ++d) table.d[d] = region_ptrs(send_, d);
    if (T > 0) {
      a2a::slot_kernel<<<G, a2a::kPackThreads, 0, st>>>(placement_->get(), me_, T, chunk, in.topk_ids, K,
                                                        chunk_counts_.get<int32_t>(), slot_map_.get<int32_t>());
      EPMOE_CUDA_CHECK_LAUNCH();
      // Copies: every SM about 32 warps; rows split into 2^lp parts while tokens are fewer than that.
      const int64_t warps = int64_t(sms_) * 32;
      int lp = 0;
      while (lp < 4 && (T << (lp + 1)) <= warps) ++lp;
      const int64_t items = T << lp, per_cta = a2a::kPushThreads / 32;
      const int grid = static_cast<int>(std::min<int64_t>((items + per_cta - 1) / per_cta, warps / per_cta));
      a2a::push_kernel<<<grid, a2a::kPushThreads, 0, st>>>(cfg_.dispatch_format, cfg_.quant_params(), placement_->get(),
                                                          me_, T, lp, in.hidden, in.topk_ids, in.topk_weights, H, K,
                                                          slot_map_.get<int32_t>(), table);
      EPMOE_CUDA_CHECK_LAUNCH();
    }
    // Slots past the count read as id -1; reset the regions that shrank since the last call.
    for (int s = 0; s < R_; ++s) {
      if (recv_counts_[s] < prev_recv_[s]) {
        int32_t* ids = recv_.ids.get<int32_t>() + (size_t(s) * C + recv_counts_[s]) * K;
        EPMOE_CUDA_CHECK(cudaMemsetAsync(ids, 0xff, size_t(prev_recv_[s] - recv_counts_[s]) * K * 4, st));
      }
    }
    exchange(st, [&](int d) { return region_ptrs(send_, d); }, [&](int s) { return region_ptrs(recv_, s); },
             send_counts_, recv_counts_, ps_, ss_, K, "dispatch/payload");
    prev_recv_ = recv_counts_;

    // 4. Counts and expert counts for the runner.
    std::memcpy(host_counts_, recv_counts_.data(), size_t(R_) * 4);
    EPMOE_CUDA_CHECK(cudaMemcpyAsync(counts_.get(), host_counts_, size_t(R_) * 4, cudaMemcpyHostToDevice, st));
    const int E_loc = cfg_.experts_per_rank();
    EPMOE_CUDA_CHECK(cudaMemsetAsync(expert_counts_.get(), 0, size_t(E_loc) * 4, st));
    a2a::expert_count_kernel<<<std::max(1, std::min(1024, (R_ * C * K + 255) / 256)), 256, 0, st>>>(
        recv_.ids.get<int32_t>(), counts_.get<int32_t>(), R_, C, K, E_loc, expert_counts_.get<int32_t>());
    EPMOE_CUDA_CHECK_LAUNCH();
    // The counts copy reads host_counts_ asynchronously: the next dispatch rewrites it only after
    // its own wait on this stream.
    have_dispatch_ = true;

    return make_dispatch_output(cfg_, DeviceKind::cuda,
                                RecvBuffers{recv_.payload.get<uint8_t>(), recv_.scales.get<uint8_t>(),
                                            recv_.ids.get<int32_t>(), recv_.weights.get<float>(),
                                            counts_.get<int32_t>(), expert_counts_.get<int32_t>()});
  }

  void combine(const CombineInput& in, bf16_raw* out) override {
    const auto dev = comm_.activate();
    if (!have_dispatch_) throw UsageError(combine_without_dispatch());
    have_dispatch_ = false;
    cudaStream_t st = static_cast<cudaStream_t>(in.stream);
    const int C = cfg_.capacity, H = cfg_.hidden;
    int64_t received = 0;
    for (int s = 0; s < R_; ++s) received += recv_counts_[s];
    // Both errors are local; a peer then times out in its next bounded wait instead of hanging.
    if (!in.y && received > 0) throw UsageError(combine_null_y(received));
    if (!out && T_ > 0) throw UsageError(combine_null_out(T_));
    const ActFormat cf = cfg_.combine_format;
    const uint8_t* src_payload = reinterpret_cast<const uint8_t*>(in.y);
    const uint8_t* src_scales = nullptr;
    if (cf != ActFormat::bf16 && received > 0) {
      a2a::encode_rows_kernel<<<std::min<int64_t>(1024, (received + 7) / 8), 256, 0, st>>>(
          cf, cfg_.quant_params(), in.y, counts_.get<int32_t>(), R_, C, H, comb_send_payload_.get<uint8_t>(),
          comb_send_scales_.get<uint8_t>());
      EPMOE_CUDA_CHECK_LAUNCH();
      src_payload = comb_send_payload_.get<uint8_t>();
      src_scales = comb_send_scales_.get<uint8_t>();
    }
    // What we received from s goes back to s; what we sent to d comes back into region d.
    auto send_of = [&](int s) {
      return a2a::DestRegion{const_cast<uint8_t*>(src_payload) + size_t(s) * C * cps_,
                             src_scales ? const_cast<uint8_t*>(src_scales) + size_t(s) * C * css_ : nullptr, nullptr,
                             nullptr};
    };
    auto recv_of = [&](int d) {
      return a2a::DestRegion{comb_recv_payload_.get<uint8_t>() + size_t(d) * C * cps_,
                             css_ ? comb_recv_scales_.get<uint8_t>() + size_t(d) * C * css_ : nullptr, nullptr, nullptr};
    };
    exchange(st, send_of, recv_of, recv_counts_, send_counts_, cps_, css_, 0, "combine/payload");
    if (T_ > 0) {
      a2a::reduce_kernel<<<std::min<int64_t>(1024, (T_ + 7) / 8), 256, 0, st>>>(
          cf, H, R_, C, T_, slot_map_.get<int32_t>(), comb_recv_payload_.get<uint8_t>(),
          comb_recv_scales_.get<uint8_t>(), out);
      EPMOE_CUDA_CHECK_LAUNCH();
    }
  }

  // Waits for the last call (bounded) so that asynchronous NCCL errors surface.
  void sync(void* stream) override {
    const auto dev = comm_.activate();
    comm_.wait(static_cast<cudaStream_t>(stream), "nccl dispatcher sync");
  }

 private:
  struct Region {
    cuda::DeviceBuffer payload, scales, ids, weights;
  };

  a2a::DestRegion region_ptrs(Region& r, int d) const {
    const size_t base = size_t(d) * cfg_.capacity;
    return a2a::DestRegion{r.payload.get<uint8_t>() + base * ps_, ss_ ? r.scales.get<uint8_t>() + base * ss_ : nullptr,
                           r.ids.get<int32_t>() + base * cfg_.top_k, r.weights.get<float>() + base * cfg_.top_k};
  }

  // One NCCL group: rows of send_of(d) (n_send[d] of them) to every d, rows from every s into
  // recv_of(s) (n_recv[s]); our own rows by a device copy. K = 0: no ids/weights arrays.
  template <class SendOf, class RecvOf>
  void exchange(cudaStream_t st, SendOf send_of, RecvOf recv_of, const std::vector<int32_t>& n_send,
                const std::vector<int32_t>& n_recv, size_t ps, size_t ss, int K, const char* where) {
    (void)where;  // NCCL enqueues; a missing peer surfaces in the next bounded wait
    auto bytes = [&](const a2a::DestRegion& r, int which) -> uint8_t* {
      switch (which) {
        case 0: return r.payload;
        case 1: return r.scales;
        case 2: return reinterpret_cast<uint8_t*>(r.ids);
        default: return reinterpret_cast<uint8_t*>(r.weights);
      }
    };
    const size_t row[4] = {ps, ss, size_t(K) * 4, size_t(K) * 4};
    const int parts = K > 0 ? 4 : 2;
    {
      const a2a::DestRegion s = send_of(me_), r = recv_of(me_);
      for (int i = 0; i < parts; ++i)
        if (row[i] && n_send[me_] > 0)
          EPMOE_CUDA_CHECK(cudaMemcpyAsync(bytes(r, i), bytes(s, i), row[i] * n_send[me_], cudaMemcpyDeviceToDevice, st));
    }
    EPMOE_NCCL_CHECK(ncclGroupStart());
    for (int p = 0; p < R_; ++p) {
      if (p == me_) continue;
      const a2a::DestRegion s = send_of(p), r = recv_of(p);
      for (int i = 0; i < parts; ++i) {
        if (!row[i]) continue;
        if (n_send[p] > 0) EPMOE_NCCL_CHECK(ncclSend(bytes(s, i), row[i] * n_send[p], ncclUint8, p, comm_.handle(), st));
        if (n_recv[p] > 0) EPMOE_NCCL_CHECK(ncclRecv(bytes(r, i), row[i] * n_recv[p], ncclUint8, p, comm_.handle(), st));
      }
    }
    EPMOE_NCCL_CHECK(ncclGroupEnd());
  }

  MoeConfig cfg_;
  NcclComm& comm_;
  int R_, me_;
  int sms_ = 0;  // SMs of this GPU: the push kernel's grid
  size_t ps_ = 0, ss_ = 0, cps_ = 0, css_ = 0;
  std::unique_ptr<DevicePlacement> placement_;
  Region send_, recv_;
  cuda::DeviceBuffer chunk_counts_, bad_, slot_map_, counts_, expert_counts_;
  cuda::DeviceBuffer comb_send_payload_, comb_send_scales_, comb_recv_payload_, comb_recv_scales_;
  cuda::DeviceBuffer header_dev_, all_dev_;
  void* host_ = nullptr;
  int32_t* host_all_ = nullptr;     // pinned [R][kHeader + R]
  int32_t* host_counts_ = nullptr;  // pinned [R]
  std::vector<int32_t> send_counts_, recv_counts_, prev_recv_ = std::vector<int32_t>(a2a::kMaxRanks, 0);
  int64_t T_ = 0;
  bool have_dispatch_ = false;
};

}  // namespace

std::unique_ptr<Dispatcher> make_nccl_dispatcher(const MoeConfig& cfg, Communicator& comm) {
  return std::make_unique<NcclDispatcher>(cfg, comm);
}


}  // namespace epmoe::detail
