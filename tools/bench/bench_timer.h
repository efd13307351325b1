// The one GPU timer of the benches: CUDA events around each timed call on one stream.
#pragma once
#if defined(EPMOE_WITH_CUDA)
#include <cuda_runtime.h>

#include <functional>
#include <vector>

namespace epmoe::cli {

struct TimeSpec {
  int warm = 0;            // untimed eager calls first (workspaces grow, caches fill)
  int reps = 1;            // timed calls
  bool graph = false;      // capture one call into a CUDA graph and time its replays (fn must be capturable)
  bool sync_each = false;  // wait for each call before the next (isolated latency); else queued back to back
};

// Microseconds of each timed call of fn on `st`, each between its own pair of events.
std::vector<double> time_each_us(cudaStream_t st, const TimeSpec& spec, const std::function<void()>& fn);
// Their median (bench_util.h's median).
double median_us(cudaStream_t st, const TimeSpec& spec, const std::function<void()>& fn);

}  // namespace epmoe::cli
#endif
