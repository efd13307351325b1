// CUDA activation quantizers vs the CPU reference: payload, scales and dequantized values bitwise
// equal, for the hidden sizes of DeepSeek-V3, Qwen3 and Mixtral, ue8m0 on and off, with zero
// blocks, tiny blocks (the 1e-4 amax floor) and Inf/NaN values.
#include <gtest/gtest.h>

#include <limits>
#include <random>
#include <vector>

#include "epmoe/error.h"
#include "epmoe/quant.h"
#include "common/gpu_test_util.h"
#include "quant/cuda/quant.h"

namespace epmoe::test {
namespace {

void check_format(ActFormat f, const QuantParams& p, int64_t T, int H, std::mt19937& rng) {
  SCOPED_TRACE(std::string(format_name(f)) + " T=" + std::to_string(T) + " H=" + std::to_string(H) +
               (p.ue8m0 ? " ue8m0" : ""));
  auto x = random_bf16(rng, T, H);
  if (T > 2) {
    for (int h = 0; h < std::min(H, 128); ++h) x[size_t(1) * H + h] = 0;                      // zero block
    for (int h = 0; h < std::min(H, 128); ++h) x[size_t(2) * H + h] = num::f32_to_bf16(1e-7f * (h - 64));
    x[size_t(2) * H + H - 1] = num::f32_to_bf16(std::numeric_limits<float>::infinity());
    x[size_t(2) * H + H - 20] = num::f32_to_bf16(std::numeric_limits<float>::quiet_NaN());
  }
  const size_t pb = payload_bytes(f, H), sb = scale_bytes(f, H);
  std::vector<uint8_t> pay_ref(T * pb), sc_ref(T * sb);
  quantize_rows(f, p, x.data(), T, H, pay_ref.data(), sc_ref.data());
  std::vector<float> deq_ref(size_t(T) * H);
  dequantize_rows(f, p, pay_ref.data(), sc_ref.data(), T, H, deq_ref.data());

  Dev<bf16_raw> dx(x);
  Dev<uint8_t> pay(T * pb), sc(std::max<size_t>(T * sb, 1));
  Dev<float> deq(size_t(T) * H);
  pay.poison();
  sc.poison();
  deq.poison();
  cuda::quantize_rows(f, p, dx.get(), T, H, pay.get(), sc.get(), nullptr);
  cuda::dequantize_rows(f, p, pay.get(), sc.get(), T, H, deq.get(), nullptr);
  EPMOE_CUDA_CHECK(cudaDeviceSynchronize());
  const auto pay_gpu = pay.download();
  EXPECT_EQ(first_diff(pay_gpu, pay_ref), -1);
  if (sb) {
    auto sc_gpu = sc.download();
    sc_gpu.resize(T * sb);
    EXPECT_EQ(first_diff(sc_gpu, sc_ref), -1);
  }
  const auto deq_gpu = deq.download();
  const int64_t d = first_diff(deq_gpu, deq_ref);
  EXPECT_EQ(d, -1) << "dequant " << d << ": gpu " << deq_gpu[d] << " cpu " << deq_ref[d];
}

TEST(CudaQuant, BitwiseEqualToCpu) {
  EPMOE_REQUIRE_GPU();
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  for (int H : {7168, 4096, 2048, 2880, 336}) {  // 2880, 336: a partial last fp8 block
    for (int64_t T : {int64_t(0), int64_t(1), int64_t(37)}) {
      check_format(ActFormat::bf16, {}, T, H, rng);
      check_format(ActFormat::fp8, {false, 0.f}, T, H, rng);
      check_format(ActFormat::fp8, {true, 0.f}, T, H, rng);
      check_format(ActFormat::nvfp4, {false, 448.f * 6.f / 40.f}, T, H, rng);
      check_format(ActFormat::nvfp4, {false, 448.f * 6.f / 3.f}, T, H, rng);  // gs too large: saturation
    }
  }
}

TEST(CudaQuant, RejectsBadHiddenAndScale) {
  EPMOE_REQUIRE_GPU();
  Dev<bf16_raw> x(200);
  Dev<uint8_t> out(400);
  EXPECT_THROW(cuda::quantize_rows(ActFormat::fp8, {}, x.get(), 1, 200, out.get(), out.get(), nullptr), UsageError);
  EXPECT_THROW(cuda::quantize_rows(ActFormat::nvfp4, {false, 0.f}, x.get(), 1, 160, out.get(), out.get(), nullptr),
               UsageError);
}

}  // namespace
}  // namespace epmoe::test
