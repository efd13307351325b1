// The harness's synthetic model (src/harness/synthetic.h) from Python: the weights, inputs and
// router logits `epmoe run` builds for a seed, so that Python can run the same layers and compare
// bytes with the C++ driver (python/tests/test_parity.py), and examples need no model files.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>

#include <memory>

#include "bind.h"
#include "harness/synthetic.h"
#include "tensors.h"
#include "weights.h"

namespace epmoe::py {

void bind_harness(nb::module_& m) {
  m.def("_harness_rank_weights", [](const MoeConfig& cfg, uint64_t seed, int layer, int rank) {
    auto w = std::make_unique<Weights>();
    harness::RankWeights rw;
    {
      nb::gil_scoped_release unlocked;
      rw = harness::rank_weights(cfg, seed, layer, rank);
    }
    w->w13_host = std::move(rw.w13);
    w->w2_host = std::move(rw.w2);
    w->w = ExpertWeights{w->w13_host.experts, cfg.hidden, cfg.intermediate, w->w13_host.view(), w->w2_host.view()};
    return w;
  }, nb::arg("config"), nb::arg("seed"), nb::arg("layer"), nb::arg("rank"));
  m.def("_harness_random_hidden", [](int64_t T, int H, uint64_t seed) {
    if (T < 0 || H < 1) throw UsageError("random_hidden(T=" + std::to_string(T) + ", H=" + std::to_string(H) + ")");
    return numpy_of(harness::random_hidden(T, H, seed), {size_t(T), size_t(H)});
  }, nb::arg("tokens"), nb::arg("hidden"), nb::arg("seed"));
  m.def("_harness_router_bias", [](const MoeConfig& cfg, uint64_t seed, int layer) {
    harness::RouterWeights rt = harness::router_weights(cfg, seed, layer);
    return numpy_of(std::move(rt.bias), {size_t(cfg.num_experts)});
  }, nb::arg("config"), nb::arg("seed"), nb::arg("layer"));
  m.def("_harness_router_logits", [](const MoeConfig& cfg, uint64_t seed, int layer, const Array& hidden) {
    const TensorView h = view_of(hidden, "hidden");
    if (h.dtype != DType::bf16 || h.ndim != 2 || h.shape[1] != cfg.hidden || h.device != DeviceKind::cpu ||
        !h.is_contiguous())
      throw UsageError("router_logits: hidden is " + h.describe() + "; expected contiguous bf16 [T, " +
                       std::to_string(cfg.hidden) + "] on the CPU");
    const harness::RouterWeights rt = harness::router_weights(cfg, seed, layer);
    std::vector<float> logits(size_t(h.shape[0]) * cfg.num_experts);
    harness::router_logits(rt, cfg.hidden, cfg.num_experts, h.as<const bf16_raw>(), h.shape[0], logits.data());
    return numpy_of(std::move(logits), {size_t(h.shape[0]), size_t(cfg.num_experts)});
  }, nb::arg("config"), nb::arg("seed"), nb::arg("layer"), nb::arg("hidden"));
}

}  // namespace epmoe::py
