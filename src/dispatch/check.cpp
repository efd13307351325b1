#include "dispatch/check.h"

namespace epmoe::detail {

using namespace input;

InputProblem check_input_shape(int64_t num_tokens, int capacity, const void* hidden, const void* ids,
                               const void* weights) {
  InputProblem p;
  p.num_tokens = num_tokens;
  if (num_tokens < 0) {
    p.code = kNegative;
  } else if (num_tokens > capacity) {
    p.code = kOverCapacity;
  } else if (num_tokens > 0 && (!hidden || !ids || !weights)) {
    p.code = kNullInput;
    p.value = !hidden ? kNullHidden : !ids ? kNullIds : kNullWeights;
  }
  return p;
}

InputProblem check_input(int64_t num_tokens, int capacity, int num_experts, int top_k, const void* hidden,
                         const int32_t* ids, const float* weights) {
  InputProblem p = check_input_shape(num_tokens, capacity, hidden, ids, weights);
  if (!p.ok()) return p;
  for (int64_t t = 0; t < num_tokens; ++t)
    for (int k = 0; k < top_k; ++k) {
      const int32_t id = ids[size_t(t) * top_k + k];
      if (id < -1 || id >= num_experts) {
        p.code = kBadId;
        p.token = t;
        p.k = k;
        p.value = id;
        return p;
      }
    }
  return p;
}

InputProblem decode_input_record(const int32_t* rec) {
  InputProblem p;
  p.code = rec[kRecCode];
  p.num_tokens = rec[kRecTokens];
  p.token = rec[kRecToken];
  p.k = rec[kRecK];
  p.value = rec[kRecValue];
  return p;
}

std::string input_message(const InputProblem& p, int rank, int capacity, int num_experts) {
  const std::string r = "rank " + std::to_string(rank) + ": ";
  const std::string T = std::to_string(p.num_tokens), C = std::to_string(capacity), E = std::to_string(num_experts);
  switch (p.code) {
    case kOk:
      return "";
    case kNegative:
      return r + "num_tokens=" + T + " is negative; pass T >= 0 tokens";
    case kOverCapacity:
      return r + "T=" + T + " tokens exceeds capacity C=" + C +
             "; raise MoeConfig::capacity (--capacity) or send at most " + C + " tokens per call";
    case kNullInput: {
      const char* field = p.value == kNullHidden ? "hidden" : p.value == kNullIds ? "topk_ids" : "topk_weights";
      return r + "DispatchInput::" + field + " is null with T=" + T +
             " > 0; pass [T, H] hidden and [T, K] topk_ids and topk_weights";
    }
    case kBadId:
      return r + "topk_ids[token " + std::to_string(p.token) + ", k " + std::to_string(p.k) + "] = " +
             std::to_string(p.value) + " is outside [-1, E=" + E + "); pass expert ids in [0, " + E +
             ") or -1 for none";
    default:
      return r + "unknown input problem code " + std::to_string(p.code) +
             " (ranks built from different epmoe versions?); rebuild every rank from one version";
  }
}

std::string rejected_dispatch(const std::vector<std::string>& rank_messages) {
  std::string all;
  for (const std::string& m : rank_messages) {
    if (m.empty()) continue;
    all += (all.empty() ? "" : "; ") + m;
  }
  return all.empty() ? all : "dispatch: " + all + " (nothing was sent)";
}

std::string combine_without_dispatch() {
  return "combine called without a successful dispatch before it; call dispatch() first (one combine per dispatch)";
}

std::string combine_null_y(int64_t received) {
  return "CombineInput::y is null but " + std::to_string(received) +
         " tokens were dispatched to this rank; pass the runner output [R][C][H]";
}

std::string combine_null_out(int64_t num_tokens) {
  return "combine: out is null with T=" + std::to_string(num_tokens) + " > 0; pass [T, H] bf16";
}

}  // namespace epmoe::detail
