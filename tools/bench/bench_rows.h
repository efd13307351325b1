// How `epmoe bench runner` spreads the M rows of a call (slots, top-k folded in: one expert per
// slot) over the GPU's E local experts: the one home of that rule, for the timed runs and for
// --dry-run's plan alike (no GPU needed).
#pragma once
#include <cstdint>
#include <vector>

#include "epmoe/config.h"

namespace epmoe::cli {

enum class BenchRouting {
  uniform,  // slot j -> expert j % E
  skew,     // the first half of the slots on the first tenth of the experts, the rest uniform
  router,   // the model's router on random N(0, 1) logits, its picks of experts 0..E-1 in order
};

class BenchRows {
 public:
  BenchRows(BenchRouting routing, const MoeConfig& model, int local_experts, long long max_rows);
  // The expert of slot j in a call of M slots (j < M <= max_rows).
  int32_t expert(long long j, long long M) const;
  // Rows of each local expert in a call of M slots.
  std::vector<int> counts(long long M) const;
  // Local experts that receive rows in a call of M slots (only their weights are read).
  int touched(long long M) const;
  // The routing in the words of the table footers.
  const char* describe() const;

 private:
  BenchRouting routing_;
  int E_, hot_;
  std::vector<int32_t> routed_;  // router: the expert of every slot up to max_rows
};

}  // namespace epmoe::cli
