// The "local" dispatcher on the CPU: one rank (R = 1), no communication. Same receive layout and
// the same arithmetic as the "cpu" dispatcher with R = 1 (including the combine format round trip,
// so a layer gives the same bits on either).
#include <memory>
#include <string>
#include <vector>

#include "combine/reduce.h"
#include "dispatch/check.h"
#include "dispatch/plan.h"
#include "epmoe/comm.h"
#include "epmoe/config.h"
#include "epmoe/dispatch.h"
#include "epmoe/error.h"
#include "epmoe/quant.h"

namespace epmoe::detail {

std::unique_ptr<Dispatcher> make_local_cpu_dispatcher(const MoeConfig& cfg, Communicator& comm);

namespace {

class LocalDispatcher final : public Dispatcher {
 public:
  explicit LocalDispatcher(const MoeConfig& cfg) : cfg_(cfg), placement_(cfg.resolved_placement()) {
    recv_.allocate(1, cfg.capacity, cfg.hidden, cfg.top_k, cfg.experts_per_rank(), cfg.dispatch_format);
    comb_payload_.assign(size_t(cfg.capacity) * payload_bytes(cfg.combine_format, cfg.hidden), 0);
    comb_scales_.assign(size_t(cfg.capacity) * scale_bytes(cfg.combine_format, cfg.hidden), 0);
  }

  const char* name() const override { return "local"; }

  DispatchOutput dispatch(const DispatchInput& in) override {
    have_dispatch_ = false;
    const int H = cfg_.hidden, K = cfg_.top_k;
    const InputProblem problem = check_input(in.num_tokens, cfg_.capacity, cfg_.num_experts, K, in.hidden,
                                             in.topk_ids, in.topk_weights);
    if (!problem.ok())
      throw UsageError(rejected_dispatch({input_message(problem, 0, cfg_.capacity, cfg_.num_experts)}));
    DispatchPlan plan = make_dispatch_plan(placement_, 0, in.topk_ids, in.num_tokens, K);
    const EncodedRows enc =
        encode_source_rows(cfg_.dispatch_format, cfg_.quant_params(), in.hidden, in.num_tokens, H, enc_);
    const uint8_t* enc_payload = enc.payload;
    const uint8_t* enc_scales = enc.scales;
    write_region(plan, 0, 0, enc_payload, enc_scales, in.topk_weights, recv_);
    recv_.counts[0] = plan.send_counts[0];
    finalize_receive(recv_);
    plan_ = std::move(plan);
    have_dispatch_ = true;
    return make_dispatch_output(cfg_, DeviceKind::cpu, recv_.buffers());
  }

  void combine(const CombineInput& in, bf16_raw* out) override {
    if (!have_dispatch_) throw UsageError(combine_without_dispatch());
    const int H = cfg_.hidden, n = recv_.counts[0];
    if (!in.y && n > 0) throw UsageError(combine_null_y(n));
    if (!out && plan_.num_tokens > 0) throw UsageError(combine_null_out(plan_.num_tokens));
    const ActFormat f = cfg_.combine_format;
    const bool has_scales = scale_bytes(f, H) > 0;
    encode_combine_rows(f, cfg_.quant_params(), in.y, n, H, comb_payload_.data(),
                        has_scales ? comb_scales_.data() : nullptr);
    combine_sum(f, cfg_.quant_params(), H, cfg_.capacity, plan_, comb_payload_.data(),
                has_scales ? comb_scales_.data() : nullptr, out);
  }

 private:
  MoeConfig cfg_;
  ExpertPlacement placement_;
  HostRecvBuffers recv_;
  std::vector<uint8_t> comb_payload_, comb_scales_;
  EncodeBuffers enc_;
  DispatchPlan plan_;
  bool have_dispatch_ = false;
};

}  // namespace

std::unique_ptr<Dispatcher> make_local_cpu_dispatcher(const MoeConfig& cfg, Communicator& comm) {
  if (comm.size() != 1)
    throw UsageError("dispatcher \"local\" runs one rank but the communicator has " + std::to_string(comm.size()) +
                     " ranks; use dispatcher \"cpu\" for a cpu group");
  if (cfg.num_ranks != 1)
    throw UsageError("MoeConfig::num_ranks=" + std::to_string(cfg.num_ranks) +
                     " but dispatcher \"local\" runs exactly one rank; set num_ranks=1 (--ranks 1)");
  validate_or_throw(cfg);
  comm.check_same(config_fingerprint(cfg), "MoeConfig");
  return std::make_unique<LocalDispatcher>(cfg);
}

}  // namespace epmoe::detail
