// The README's quick start, compiled and run by the test suite (ctest -R example) so it cannot rot.
// Four ranks as threads on the CPU reference fabric, qwen3-30b-a3b expert shapes cut down to a
// handful of experts, fp8 dispatch; rank 1 has no tokens.
#include <epmoe/epmoe.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

using namespace epmoe;

int main() {
  MoeConfig cfg = preset("qwen3-30b-a3b").config;  // H 2048, I 768, K 8, softmax routing
  cfg.num_experts = 16;                            // small enough for a quick CPU run
  cfg.top_k = 4;
  cfg.num_ranks = 4;
  cfg.capacity = 32;
  cfg.dispatch_format = ActFormat::fp8;  // what travels between ranks
  cfg.weight_format = WeightFormat::fp8;
  cfg.dispatcher = "cpu";
  cfg.runner = "reference";
  validate_or_throw(cfg);  // every problem at once, each naming field, value and fix

  const int H = cfg.hidden, I = cfg.intermediate, E = cfg.num_experts, El = cfg.experts_per_rank();
  std::mt19937 gen(7);
  std::normal_distribution<float> nd(0.f, 0.02f);
  auto randn = [&](size_t n) { std::vector<float> v(n); for (auto& x : v) x = nd(gen); return v; };

  // Each rank holds E/R experts: W13 [E_loc][2I][H] (gate rows, then up rows) and W2 [E_loc][H][I].
  std::vector<HostMatrix> w13, w2;
  for (int r = 0; r < cfg.num_ranks; ++r) {
    w13.push_back(quantize_matrix(randn(size_t(El) * 2 * I * H).data(), El, 2 * I, H, cfg.weight_format));
    w2.push_back(quantize_matrix(randn(size_t(El) * H * I).data(), El, H, I, cfg.weight_format));
  }
  const std::vector<int> tokens = {20, 0, 32, 7};  // T differs per rank, and may be 0
  std::vector<std::vector<bf16_raw>> hidden(4), out(4);
  std::vector<std::vector<float>> logits(4);
  for (int r = 0; r < 4; ++r) {
    for (float x : randn(size_t(tokens[r]) * H)) hidden[r].push_back(num::f32_to_bf16(x * 50.f));
    logits[r] = randn(size_t(tokens[r]) * E);
    out[r].assign(size_t(tokens[r]) * H, 0);
  }

  auto comms = make_cpu_group(cfg.num_ranks, cfg.timeout_ms);
  run_ranks(comms, [&](Communicator& comm) {
    const int r = comm.rank();
    ExpertWeights w{El, H, I, w13[r].view(), w2[r].view()};
    MoeLayer layer(cfg, comm, w);  // collective: checks that all ranks agree on cfg
    const int64_t T = tokens[r];
    layer.forward(TensorView::of(hidden[r].data(), DType::bf16, {T, H}),
                  TensorView::of(logits[r].data(), DType::f32, {T, E}),
                  TensorView::of(out[r].data(), DType::bf16, {T, H}));
  });

  double norm = 0;
  for (auto& o : out)
    for (bf16_raw b : o) norm += double(num::bf16_to_f32(b)) * num::bf16_to_f32(b);
  std::printf("quickstart: 4 ranks, tokens 20/0/32/7, fp8 dispatch; |out| = %.4f\n", std::sqrt(norm));
  return std::isfinite(norm) && norm > 0 ? 0 : 1;
}
