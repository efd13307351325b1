// Random host inputs for the CPU runner tests (tests/run/test_reference*.cpp): a received batch as
// a dispatcher hands it to the runner, and expert weights from the harness generator.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

#include "epmoe/dispatch.h"
#include "epmoe/numeric.h"
#include "epmoe/quant.h"
#include "harness/synthetic.h"

namespace epmoe::test {

// A hand-made DispatchOutput on the host: R source regions of capacity C, counts[s] valid slots
// in region s.
struct ReceivedBatch {
  int R = 0, C = 0, H = 0, K = 0, El = 0;
  ActFormat format = ActFormat::bf16;
  QuantParams quant;
  std::vector<int32_t> counts;  // [R]
  std::vector<bf16_raw> x;      // [R*C][H] the tokens before quantization
  std::vector<uint8_t> payload, scales;
  std::vector<int32_t> ids;  // [R*C][K], -1 on invalid slots
  std::vector<float> w;      // [R*C][K]

  // With R, C, H, K, El, format and counts set: every slot's token x ~ N(0, 1) (nvfp4: global scale
  // from x), quantized to `format`; ids uniform in [-1, El) on valid slots; weights in [0.05, 1).
  void draw(std::mt19937_64& rng) {
    std::normal_distribution<float> nd(0.f, 1.f);
    std::uniform_int_distribution<int> id(-1, El - 1);
    std::uniform_real_distribution<float> ud(0.05f, 1.f);
    x.resize(size_t(R) * C * H);
    for (auto& v : x) v = num::f32_to_bf16(nd(rng));
    if (format == ActFormat::nvfp4) quant.nvfp4_global_scale = nvfp4_global_scale_bf16(x.data(), x.size());
    payload.resize(size_t(R) * C * payload_bytes(format, H));
    scales.resize(size_t(R) * C * scale_bytes(format, H));
    quantize_rows(format, quant, x.data(), int64_t(R) * C, H, payload.data(), scales.data());
    ids.assign(size_t(R) * C * K, -1);
    w.resize(size_t(R) * C * K);
    for (int s = 0; s < R; ++s)
      for (int j = 0; j < counts[s]; ++j)
        for (int k = 0; k < K; ++k) ids[(size_t(s) * C + j) * K + k] = id(rng);
    for (auto& v : w) v = ud(rng);
  }

  DispatchOutput view() const {
    DispatchOutput d;
    d.num_ranks = R, d.capacity = C, d.hidden = H, d.top_k = K, d.num_local_experts = El;
    d.format = format, d.quant = quant, d.device = DeviceKind::cpu;
    d.payload = payload.data();
    d.scales = scales.empty() ? nullptr : scales.data();
    d.local_ids = ids.data(), d.weights = w.data(), d.counts = counts.data();
    return d;
  }
};

// W13 [El][2I][H], then W2 [El][H][I]: experts 0..El-1 of layer 0 of the harness's synthetic
// model (harness/synthetic.h; uniform, standard deviation 1/sqrt(fan_in)).
inline void random_expert_weights(uint64_t seed, int El, int H, int I, std::vector<float>& w13,
                                  std::vector<float>& w2) {
  MoeConfig c;
  c.hidden = H;
  c.intermediate = I;
  w13.clear();
  w2.clear();
  w13.reserve(size_t(El) * 2 * I * H);
  w2.reserve(size_t(El) * H * I);
  for (int e = 0; e < El; ++e) {
    const harness::ExpertMasters m = harness::expert_masters(c, seed, 0, e);
    w13.insert(w13.end(), m.w13.begin(), m.w13.end());
    w2.insert(w2.end(), m.w2.begin(), m.w2.end());
  }
}

}  // namespace epmoe::test
