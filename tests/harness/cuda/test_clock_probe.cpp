// The measured SM clock (harness/cuda/clock_probe.h): a plausible figure, under the device's peak.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>

#include "common/gpu_test_util.h"
#include "harness/cuda/clock_probe.h"

namespace epmoe {
namespace {

TEST(ClockProbe, ReadsAClockUnderThePeak) {
  EPMOE_REQUIRE_GPU();
  int peak_khz = 0;
  EPMOE_CUDA_CHECK(cudaDeviceGetAttribute(&peak_khz, cudaDevAttrClockRate, 0));
  const double mhz = harness::cuda::sm_clock_mhz(nullptr);
  std::printf("[clock] SM clock %.0f MHz (peak %d MHz)\n", mhz, peak_khz / 1000);
  EXPECT_GT(mhz, 100.0);
  // 5% above the peak for the events' resolution.
  if (peak_khz > 0) EXPECT_LT(mhz, peak_khz / 1e3 * 1.05);
}

}  // namespace
}  // namespace epmoe
