// Instantiations of the decode wgmma engine (bf16 and fp8 x fp8), one translation unit, and the
// choice between its plain and deferred-wait pipelines (engine_wgmma.cuh).
#include <atomic>
#include <cstdlib>
#include <string>

#include "run/cuda/engine_wgmma.cuh"

namespace epmoe::cuda {

static_assert(kWgmmaBlockM == wg::kBT, "the runner's decode m-tile must match the wgmma token tile");

namespace {

// -1: not yet read from EPMOE_WGMMA_DEFER; 0: plain; 1: deferred.
std::atomic<int> g_defer{-1};

// Default deferred: bitwise the same as plain (tests/run/cuda/test_engine_wgmma.cpp, run 11) and
// faster on an H200 (DeepSeek-V3 experts, 128 local, run 11): fp8 x fp8 M = 128 / 2048 2.075 ->
// 1.800 / 1.992 -> 1.843 ms, bf16 3.154 -> 3.125 / 3.231 -> 3.181 ms.
bool defer_now() {
  int d = g_defer.load(std::memory_order_relaxed);
  if (d < 0) {
    d = 1;
    if (const char* env = std::getenv("EPMOE_WGMMA_DEFER"); env && *env) {
      const std::string v = env;
      if (v != "0" && v != "1")
        throw UsageError("environment variable EPMOE_WGMMA_DEFER='" + v +
                         "' is not 0 or 1 (1: the decode wgmma engine waits for a stage's MMAs one "
                         "iteration later)");
      d = v == "1" ? 1 : 0;
    }
    g_defer.store(d, std::memory_order_relaxed);
  }
  return d == 1;
}

}  // namespace

void set_wgmma_defer(bool on) { g_defer.store(on ? 1 : 0, std::memory_order_relaxed); }
bool wgmma_defer() { return defer_now(); }

void launch_grouped_gemm_wgmma_bf16(const GemmArgs& a, cudaStream_t stream) {
  if (defer_now()) wg::launch<false, true>(a, stream);
  else wg::launch<false, false>(a, stream);
}
void launch_grouped_gemm_wgmma_fp8(const GemmArgs& a, cudaStream_t stream) {
  if (defer_now()) wg::launch<true, true>(a, stream);
  else wg::launch<true, false>(a, stream);
}

}  // namespace epmoe::cuda
