// Communicators, expert weights and MoeLayer. forward releases the GIL while the library works, so
// simulated CPU ranks (one Python thread each) progress together.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <vector>

#include "bind.h"
#include "epmoe/comm.h"
#include "epmoe/layer.h"
#include "epmoe/quant.h"
#include "convert.h"
#include "tensors.h"

namespace epmoe::py {

namespace {

// Expert weights as the runner reads them, with what keeps their bytes alive: host matrices
// quantized here, or the caller's arrays (held as Python objects).
struct Weights {
  ExpertWeights w;
  HostMatrix w13_host, w2_host;
  std::vector<nb::object> keep;
};

void expect_3d(const TensorView& t, const char* what, int64_t e, int64_t r, int64_t c) {
  if (t.ndim != 3 || t.shape[0] != e || t.shape[1] != r || t.shape[2] != c)
    throw UsageError(std::string(what) + " is " + t.describe() + "; expected [" + std::to_string(e) + ", " +
                     std::to_string(r) + ", " + std::to_string(c) + "] (experts, rows, cols)");
  if (!t.is_contiguous()) throw UsageError(std::string(what) + " is not contiguous; pass a contiguous copy");
}

// fp32 [E_loc, 2I, H] and [E_loc, H, I] -> the format's bytes on the host (quantize_matrix).
std::unique_ptr<Weights> quantized(const Array& w13, const Array& w2, nb::handle format) {
  const WeightFormat f = field_value<WeightFormat>(format, "ExpertWeights.quantize", "format");
  const TensorView a = view_of(w13, "w13"), b = view_of(w2, "w2");
  if (a.dtype != DType::f32 || b.dtype != DType::f32 || a.device != DeviceKind::cpu || b.device != DeviceKind::cpu)
    throw UsageError("ExpertWeights.quantize takes float32 CPU arrays (w13 " + a.describe() + ", w2 " + b.describe() +
                     ")");
  if (a.ndim != 3) throw UsageError("w13 is " + a.describe() + "; expected [E_loc, 2*I, H]");
  const int E = int(a.shape[0]), I2 = int(a.shape[1]), H = int(a.shape[2]);
  if (I2 % 2 != 0) throw UsageError("w13 is " + a.describe() + "; its rows (gate then up) must be even");
  expect_3d(a, "w13", E, I2, H);
  expect_3d(b, "w2", E, H, I2 / 2);
  auto w = std::make_unique<Weights>();
  {
    nb::gil_scoped_release unlocked;
    w->w13_host = quantize_matrix(a.as<const float>(), E, I2, H, f);
    w->w2_host = quantize_matrix(b.as<const float>(), E, H, I2 / 2, f);
  }
  w->w = ExpertWeights{E, H, I2 / 2, w->w13_host.view(), w->w2_host.view()};
  return w;
}

// bf16 arrays (CPU or one CUDA device), used in place.
std::unique_ptr<Weights> bf16_views(nb::object w13_obj, nb::object w2_obj) {
  const Array w13 = nb::cast<Array>(w13_obj), w2 = nb::cast<Array>(w2_obj);
  const TensorView a = view_of(w13, "w13"), b = view_of(w2, "w2");
  if (a.dtype != DType::bf16 || b.dtype != DType::bf16)
    throw UsageError("ExpertWeights.bf16 takes bfloat16 tensors (uint16 bits for numpy); got w13 " + a.describe() +
                     ", w2 " + b.describe());
  if (a.device != b.device || a.device_index != b.device_index)
    throw UsageError("w13 (" + a.describe() + ") and w2 (" + b.describe() + ") must be on the same device");
  if (a.ndim != 3) throw UsageError("w13 is " + a.describe() + "; expected [E_loc, 2*I, H]");
  const int E = int(a.shape[0]), I2 = int(a.shape[1]), H = int(a.shape[2]);
  expect_3d(a, "w13", E, I2, H);
  expect_3d(b, "w2", E, H, I2 / 2);
  auto w = std::make_unique<Weights>();
  auto mat = [&](const TensorView& t, int rows, int cols) {
    MatrixView m;
    m.format = WeightFormat::bf16;
    m.experts = E, m.rows = rows, m.cols = cols;
    m.data = t.data;
    m.device = t.device;
    return m;
  };
  w->w = ExpertWeights{E, H, I2 / 2, mat(a, I2, H), mat(b, H, I2 / 2)};
  w->keep = {w13_obj, w2_obj};
  return w;
}

}  // namespace

void bind_layer(nb::module_& m) {
  nb::class_<Communicator>(m, "Communicator", "Who the ranks of an expert-parallel group are.")
      .def_prop_ro("rank", &Communicator::rank)
      .def_prop_ro("size", &Communicator::size)
      .def_prop_ro("kind", &Communicator::kind)
      .def_prop_ro("device_index", &Communicator::device_index)
      .def("__repr__", [](const Communicator& c) {
        return std::string("Communicator(kind=") + c.kind() + ", rank=" + std::to_string(c.rank()) +
               ", size=" + std::to_string(c.size()) + ")";
      });
  m.def("local_comm", [] { return make_local_comm(); }, "The single-rank communicator (dispatcher 'local'), CPU.");
  m.def("cpu_group", [](int num_ranks, int timeout_ms) {
    if (num_ranks < 1) throw UsageError("cpu_group(num_ranks=" + std::to_string(num_ranks) + "): needs at least 1 rank");
    return make_cpu_group(num_ranks, timeout_ms);
  }, nb::arg("num_ranks"), nb::arg("timeout_ms") = 10000,
        "R simulated ranks in this process (one communicator each; run each rank on its own thread).");

  nb::class_<Weights>(m, "ExpertWeights", "One rank's experts: W13 [E_loc, 2I, H] (gate rows, then up) and W2 [E_loc, H, I].")
      .def_static("quantize", &quantized, nb::arg("w13"), nb::arg("w2"), nb::arg("format"),
                  "float32 CPU arrays quantized on the host into the weight format (bf16, fp8 or nvfp4).")
      .def_static("bf16", &bf16_views, nb::arg("w13"), nb::arg("w2"),
                  "bfloat16 tensors (uint16 bits for numpy) used in place, on the CPU or one CUDA device.")
      .def_prop_ro("num_local_experts", [](const Weights& w) { return w.w.num_local_experts; })
      .def_prop_ro("hidden", [](const Weights& w) { return w.w.hidden; })
      .def_prop_ro("intermediate", [](const Weights& w) { return w.w.intermediate; })
      .def_prop_ro("format", [](const Weights& w) { return w.w.w13.format; })
      .def_prop_ro("nbytes", [](const Weights& w) {
        return w.w.w13.data_bytes() + w.w.w13.scale_bytes() + w.w.w2.data_bytes() + w.w.w2.scale_bytes();
      });

  nb::class_<MoeLayer>(m, "MoeLayer", "One rank's share of an expert-parallel MoE layer.")
      .def("__init__",
           [](MoeLayer* self, const MoeConfig& cfg, Communicator& comm, const Weights& w) {
             nb::gil_scoped_release unlocked;  // collective: the other ranks' threads must run
             new (self) MoeLayer(cfg, comm, w.w);
           },
           nb::arg("config"), nb::arg("comm"), nb::arg("weights"), nb::keep_alive<1, 3>(), nb::keep_alive<1, 4>())
      .def_prop_ro("rank", &MoeLayer::rank)
      .def_prop_ro("config", [](const MoeLayer& l) { return l.config(); })
      .def("_forward",
           [](MoeLayer& l, const Array& hidden, const Array& logits, const Array& out, uintptr_t stream) {
             const TensorView h = view_of(hidden, "hidden"), g = view_of(logits, "router_logits"),
                              o = view_of(out, "out");
             nb::gil_scoped_release unlocked;
             l.forward(h, g, o, reinterpret_cast<Stream>(stream));
           },
           nb::arg("hidden"), nb::arg("router_logits"), nb::arg("out"), nb::arg("stream") = 0)
      .def("_forward_routed",
           [](MoeLayer& l, const Array& hidden, const Array& ids, const Array& weights, const Array& out,
              uintptr_t stream) {
             const TensorView h = view_of(hidden, "hidden"), i = view_of(ids, "topk_ids"),
                              w = view_of(weights, "topk_weights"), o = view_of(out, "out");
             nb::gil_scoped_release unlocked;
             l.forward_routed(h, i, w, o, reinterpret_cast<Stream>(stream));
           },
           nb::arg("hidden"), nb::arg("topk_ids"), nb::arg("topk_weights"), nb::arg("out"), nb::arg("stream") = 0);
}

}  // namespace epmoe::py
