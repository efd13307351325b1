// Host scan of a forward's inputs for data faults (faults.h).
#include "layer/faults.h"

namespace epmoe::detail {

void scan_faults_host(const FaultScan& s, int64_t* counts) {
  for (int64_t t = 0; t < s.tokens; ++t) {
    if (s.x) {
      const uint16_t* row = s.x + t * s.hidden;
      bool bad = false;
      for (int h = 0; h < s.hidden && !bad; ++h) bad = bf16_nonfinite(row[h]);
      counts[kNonfiniteHidden] += bad;
    }
    if (s.logits) {
      bool bad = false;
      for (int e = 0; e < s.num_experts && !bad; ++e)
        bad = s.logits_bf16 ? bf16_nonfinite(static_cast<const uint16_t*>(s.logits)[t * s.num_experts + e])
                            : f32_nonfinite(num::f32_bits(static_cast<const float*>(s.logits)[t * s.num_experts + e]));
      counts[kNonfiniteLogits] += bad;
    }
    if (s.weights) {
      bool bad = false;
      for (int k = 0; k < s.top_k && !bad; ++k) bad = f32_nonfinite(num::f32_bits(s.weights[t * s.top_k + k]));
      counts[kNonfiniteWeights] += bad;
    }
    if (s.ids) {
      for (int k = 0; k < s.top_k; ++k) {
        const int32_t id = s.ids[t * s.top_k + k];
        counts[kBadIds] += (id < -1 || id >= s.num_experts);
      }
    }
  }
}

std::string fault_message(const int64_t* d, int num_experts) {
  std::string m;
  auto add = [&](int64_t n, const char* one, const char* many) {
    if (n <= 0) return;
    if (!m.empty()) m += ", ";
    m += std::to_string(n) + " " + (n == 1 ? one : many);
  };
  add(d[kNonfiniteHidden], "token with NaN/inf in hidden", "tokens with NaN/inf in hidden");
  add(d[kNonfiniteLogits], "token with a NaN/inf router logit", "tokens with NaN/inf router logits");
  add(d[kNonfiniteWeights], "token with a NaN/inf routing weight", "tokens with NaN/inf routing weights");
  const std::string range = " outside [-1, " + std::to_string(num_experts) + ")";
  add(d[kBadIds], ("topk_ids entry" + range).c_str(), ("topk_ids entries" + range).c_str());
  return m;
}

}  // namespace epmoe::detail
