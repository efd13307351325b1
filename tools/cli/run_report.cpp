#include "run_report.h"

#include <cstdio>
#include <string>

#include "bench_util.h"
#include "comm/launch.h"
#include "harness/machine.h"

namespace epmoe::cli {

namespace {
std::string list(const std::vector<int64_t>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + std::to_string(v[i]);
  return out;
}
std::string bytes(double b) {
  char buf[32];
  if (b >= double(1ull << 30)) std::snprintf(buf, sizeof buf, "%.1f GiB", b / double(1ull << 30));
  else std::snprintf(buf, sizeof buf, "%.0f MiB", std::max(1.0, b / double(1 << 20)));
  return buf;
}
}  // namespace

void print_run_summary(const RunSetup& s, const SetupCheck& k) {
  const MoeConfig& c = s.cfg;
  const int R = c.num_ranks;
  std::string where;
  if (s.device == DeviceKind::cpu) where = std::to_string(R) + (R == 1 ? " rank" : " simulated ranks (threads)") + " on the CPU";
  else if (R == 1) where = "GPU 0";
  else where = std::to_string(R) + " GPUs (" + (under_mpirun() ? "one process per GPU, mpirun" : "one process, a thread per GPU") + ")";
  std::printf("epmoe run: preset %s, H=%d I=%d E=%d K=%d, %d layer%s, %s, dispatcher %s, runner %s\n", s.preset.c_str(),
              c.hidden, c.intermediate, c.num_experts, c.top_k, s.layers, s.layers == 1 ? "" : "s", where.c_str(),
              c.dispatcher.c_str(), c.runner.c_str());
  std::printf("tokens per rank %s (C=%d), seed %llu\n", list(s.tokens).c_str(), c.capacity,
              static_cast<unsigned long long>(s.seed));
  const size_t nrows = k.per_row.size();
  std::printf("plan: %zu row%s x %d layer%s; float64 check on tokens %s per rank (--check-tokens)", nrows,
              nrows == 1 ? "" : "s", s.layers, s.layers == 1 ? "" : "s", list(k.plan.check_per_rank).c_str());
  std::printf("; %sabout %s of host memory, about %.0f s on %d cores (estimate)",
              s.device == DeviceKind::cuda ? "host side (weights, float64 check): " : "", bytes(k.plan.host_bytes).c_str(),
              std::max(1.0, k.plan.seconds), harness::cpu_cores());
  std::printf("\nerrors: final hidden state vs float64 with unquantized weights and the same routing; max_err/max_ref = "
              "max |out - ref| / max |ref|; time_ms: sum over layers of the slowest rank's forward%s\n\n",
              s.device == DeviceKind::cuda ? " (median of 3); tok/s/GPU: tokens x layers / time / GPUs" : "");
  std::fflush(stdout);
}

}  // namespace epmoe::cli
