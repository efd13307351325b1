// The "cpu" dispatcher: R ranks as threads of one process, exchanging through the shared-memory
// fabric (cpu_fabric.h). It is the reference every multi-rank backend is compared against.
//
// Protocol of one step (all ranks, same order):
//   dispatch  1. validate the input and build the plan locally;
//             2. all_gather "dispatch/counts": each rank's error or its per-destination counts. If any
//                rank reported an error, every rank throws the same UsageError and nothing moves;
//             3. quantize once, write each destination's region straight into its receive buffers;
//             4. all_gather "dispatch/payload" (the barrier that publishes the writes, plus any error
//                met while writing); then each rank finalizes its own receive buffers.
//   combine   1. encode y of every valid slot into its home rank's combine buffer, region = this rank;
//             2. all_gather "combine/payload"; 3. the home rank sums (combine/reduce.h).
// Why no extra barriers: a rank writes into a peer's buffers only after the peer has joined the
// current step's first gather ("dispatch/counts"), which it does only after it has finished reading
// everything of the previous step (its previous dispatch output and its previous combine sum).
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "combine/reduce.h"
#include "comm/cpu_fabric.h"
#include "dispatch/check.h"
#include "dispatch/plan.h"
#include "epmoe/config.h"
#include "epmoe/dispatch.h"
#include "epmoe/error.h"
#include "epmoe/quant.h"

namespace epmoe::detail {

std::unique_ptr<Dispatcher> make_cpu_dispatcher(const MoeConfig& cfg, Communicator& comm);

namespace {

// What every rank exposes to its peers (threads share one address space, so a pointer is enough).
struct RankBuffers {
  HostRecvBuffers recv;                      // dispatch receive buffers [R][C]
  std::vector<uint8_t> comb_payload, comb_scales;  // combine receive buffers [R][C] (region = sender)
};

class CpuDispatcher final : public Dispatcher {
 public:
  CpuDispatcher(const MoeConfig& cfg, CpuComm& comm) : cfg_(cfg), fabric_(comm.fabric()) {
    rank_ = comm.rank();
    R_ = comm.size();
    placement_ = cfg.resolved_placement();
    const int C = cfg.capacity, H = cfg.hidden;
    mine_.recv.allocate(R_, C, H, cfg.top_k, cfg.experts_per_rank(), cfg.dispatch_format);
    mine_.comb_payload.assign(size_t(R_) * C * payload_bytes(cfg.combine_format, H), 0);
    mine_.comb_scales.assign(size_t(R_) * C * scale_bytes(cfg.combine_format, H), 0);
    // Publish where our buffers are; the gather is also the barrier proving every peer allocated.
    const RankBuffers* self = &mine_;
    std::string msg(sizeof self, '\0');
    std::memcpy(msg.data(), &self, sizeof self);
    const std::vector<std::string> all = fabric_.all_gather(rank_, std::move(msg), "dispatcher setup");
    peers_.resize(R_);
    for (int r = 0; r < R_; ++r) std::memcpy(&peers_[r], all[r].data(), sizeof(RankBuffers*));
  }

  const char* name() const override { return "cpu"; }

  DispatchOutput dispatch(const DispatchInput& in) override {
    have_dispatch_ = false;
    const int C = cfg_.capacity, H = cfg_.hidden, K = cfg_.top_k;
    // Phase 1: validate, plan, and agree on counts (or on the errors) before anything moves.
    const InputProblem problem =
        check_input(in.num_tokens, C, cfg_.num_experts, K, in.hidden, in.topk_ids, in.topk_weights);
    DispatchPlan plan;
    std::string msg;
    if (problem.ok()) {
      plan = make_dispatch_plan(placement_, rank_, in.topk_ids, in.num_tokens, K);
      msg.assign(1, 'c');
      msg.append(reinterpret_cast<const char*>(plan.send_counts.data()), sizeof(int32_t) * R_);
    } else {
      msg.assign(1, 'e');
      msg += input_message(problem, rank_, C, cfg_.num_experts);
    }
    const std::vector<std::string> all = fabric_.all_gather(rank_, std::move(msg), "dispatch/counts");
    std::vector<std::string> problems(R_);
    for (int r = 0; r < R_; ++r)
      if (all[r][0] == 'e') problems[r] = all[r].substr(1);
    const std::string rejected = rejected_dispatch(problems);
    if (!rejected.empty()) throw UsageError(rejected);

    // Phase 2: quantize once, then write straight into each destination's receive buffers.
    std::string failure;
    try {
      const EncodedRows enc =
          encode_source_rows(cfg_.dispatch_format, cfg_.quant_params(), in.hidden, in.num_tokens, H, enc_);
      const uint8_t* enc_payload = enc.payload;
      const uint8_t* enc_scales = enc.scales;
      for (int d = 0; d < R_; ++d)
        if (plan.send_counts[d] > 0) write_region(plan, rank_, d, enc_payload, enc_scales, in.topk_weights, peers_[d]->recv);
      // Our own counts come from the gathered messages; only we write them.
      for (int s = 0; s < R_; ++s) std::memcpy(&mine_.recv.counts[s], all[s].data() + 1 + sizeof(int32_t) * rank_, 4);
    } catch (const std::exception& e) {
      failure = e.what();
    }
    publish_failures(failure, "dispatch/payload");
    finalize_receive(mine_.recv);
    plan_ = std::move(plan);
    have_dispatch_ = true;
    return make_dispatch_output(cfg_, DeviceKind::cpu, mine_.recv.buffers());
  }

  void combine(const CombineInput& in, bf16_raw* out) override {
    const int C = cfg_.capacity, H = cfg_.hidden;
    const ActFormat f = cfg_.combine_format;
    const size_t pb = payload_bytes(f, H), sb = scale_bytes(f, H);
    std::string failure;
    if (!have_dispatch_) {
      failure = combine_without_dispatch();
    } else if (!in.y && total_received() > 0) {
      failure = combine_null_y(total_received());
    } else if (!out && plan_.num_tokens > 0) {
      failure = combine_null_out(plan_.num_tokens);
    } else {
      try {
        for (int s = 0; s < R_; ++s) {
          const int n = mine_.recv.counts[s];
          if (n == 0) continue;
          RankBuffers& home = *peers_[s];
          const size_t region = size_t(rank_) * C;
          encode_combine_rows(f, cfg_.quant_params(), in.y + size_t(s) * C * H, n, H,
                              home.comb_payload.data() + region * pb,
                              sb ? home.comb_scales.data() + region * sb : nullptr);
        }
      } catch (const std::exception& e) {
        failure = e.what();
      }
    }
    publish_failures(failure, "combine/payload");
    combine_sum(f, cfg_.quant_params(), H, C, plan_, mine_.comb_payload.data(),
                sb ? mine_.comb_scales.data() : nullptr, out);
  }

 private:
  int64_t total_received() const {
    int64_t n = 0;
    for (int32_t c : mine_.recv.counts) n += c;
    return n;
  }

  // The barrier that ends a phase doubles as an error exchange, so that a rank failing mid-phase
  // makes every rank throw instead of leaving its peers waiting or reading half-written data.
  void publish_failures(const std::string& failure, const char* where) {
    const std::vector<std::string> all = fabric_.all_gather(rank_, failure, where);
    std::string errors;
    for (int r = 0; r < R_; ++r)
      if (!all[r].empty()) errors += (errors.empty() ? "" : "; ") + ("rank " + std::to_string(r) + ": ") + all[r];
    if (!errors.empty()) {
      have_dispatch_ = false;
      throw UsageError(std::string(where) + ": " + errors);
    }
  }

  MoeConfig cfg_;
  CpuFabric& fabric_;
  int rank_ = 0, R_ = 1;
  ExpertPlacement placement_;
  RankBuffers mine_;
  std::vector<RankBuffers*> peers_;
  EncodeBuffers enc_;  // this rank's rows in the dispatch format
  DispatchPlan plan_;
  bool have_dispatch_ = false;
};

}  // namespace

std::unique_ptr<Dispatcher> make_cpu_dispatcher(const MoeConfig& cfg, Communicator& comm) {
  auto* cpu = dynamic_cast<CpuComm*>(&comm);
  if (!cpu)
    throw UsageError(std::string("dispatcher \"cpu\" needs a communicator of kind cpu (make_cpu_group), got kind ") +
                     comm.kind() + "; use dispatcher \"local\" for one rank or a cpu group");
  // Collective first: configurations that differ between ranks fail here on every rank, instead of
  // one rank throwing alone below and its peers waiting for it.
  comm.check_same(config_fingerprint(cfg), "MoeConfig");
  if (cfg.num_ranks != comm.size())
    throw UsageError("MoeConfig::num_ranks=" + std::to_string(cfg.num_ranks) + " but the communicator has " +
                     std::to_string(comm.size()) + " ranks; set num_ranks (--ranks) to the group size");
  validate_or_throw(cfg);
  return std::make_unique<CpuDispatcher>(cfg, *cpu);
}

}  // namespace epmoe::detail
