// Smallest user of the installed package: one layer on the CPU reference, one rank.
#include <epmoe/epmoe.h>

#include <cstdio>
#include <vector>

int main() {
  using namespace epmoe;
  MoeConfig cfg = preset("tiny").config;
  cfg.num_ranks = 1;
  cfg.capacity = 4;
  cfg.dispatcher = "local";
  cfg.runner = "reference";
  validate_or_throw(cfg);
  const int H = cfg.hidden, I = cfg.intermediate, E = cfg.num_experts, T = 3;
  std::vector<float> w13(size_t(E) * 2 * I * H, 0.01f), w2(size_t(E) * H * I, 0.02f);
  HostMatrix m13 = quantize_matrix(w13.data(), E, 2 * I, H, cfg.weight_format);
  HostMatrix m2 = quantize_matrix(w2.data(), E, H, I, cfg.weight_format);
  auto comm = make_local_comm();
  MoeLayer layer(cfg, *comm, ExpertWeights{E, H, I, m13.view(), m2.view()});
  std::vector<bf16_raw> x(size_t(T) * H, num::f32_to_bf16(1.f)), out(size_t(T) * H);
  std::vector<float> logits(size_t(T) * E, 0.f);
  layer.forward(TensorView::of(x.data(), DType::bf16, {T, H}), TensorView::of(logits.data(), DType::f32, {T, E}),
                TensorView::of(out.data(), DType::bf16, {T, H}));
  std::printf("epmoe consumer: out[0] = %g (%s)\n", num::bf16_to_f32(out[0]), describe(cfg).c_str());
  return 0;
}
