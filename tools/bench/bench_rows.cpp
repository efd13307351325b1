#include "bench_rows.h"

#include <algorithm>

#include "harness/synthetic.h"

namespace epmoe::cli {

BenchRows::BenchRows(BenchRouting routing, const MoeConfig& model, int local_experts, long long max_rows)
    : routing_(routing), E_(local_experts), hot_(std::max(1, local_experts / 10)) {
  if (routing == BenchRouting::router) routed_ = harness::router_rows(model, local_experts, max_rows, 4242);
}

int32_t BenchRows::expert(long long j, long long M) const {
  if (routing_ == BenchRouting::router) return routed_[size_t(j)];
  return int32_t(routing_ == BenchRouting::skew && j < M / 2 ? j % hot_ : j % E_);
}

std::vector<int> BenchRows::counts(long long M) const {
  std::vector<int> c(size_t(E_), 0);
  for (long long j = 0; j < M; ++j) ++c[size_t(expert(j, M))];
  return c;
}

int BenchRows::touched(long long M) const {
  const std::vector<int> c = counts(M);
  return int(std::count_if(c.begin(), c.end(), [](int n) { return n > 0; }));
}

const char* BenchRows::describe() const {
  switch (routing_) {
    case BenchRouting::skew: return "skewed (half of the rows on a tenth of the experts)";
    case BenchRouting::router: return "the preset's router on random N(0, 1) logits (rows for local experts)";
    default: return "uniform";
  }
}

}  // namespace epmoe::cli
