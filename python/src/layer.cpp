// Communicators, expert weights and MoeLayer. forward releases the GIL while the library works, so
// simulated CPU ranks (one Python thread each) progress together.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

#include "bind.h"
#include "core/env.h"
#include "epmoe/comm.h"
#include "epmoe/layer.h"
#include "epmoe/quant.h"
#include "convert.h"
#include "tensors.h"
#include "weights.h"

#if defined(EPMOE_WITH_CUDA)
#include <cuda_runtime.h>

#include "core/cuda/check.h"
#endif
#if defined(EPMOE_WITH_NCCL)
#include "epmoe/nccl_comm.h"
#endif

namespace epmoe::py {

namespace {


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
    w->w13_host = quantize_matrix(a.as<const float>(), E, I2, H, f, I2 / 2);  // fp8: gate and up scaled apart
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

// Checkpoint-format weights used in place: fp8 (e4m3 codes + fp32 scale per 128x128 tile, the
// DeepSeek-V3/R1 layout: value = code * scale_inv; W13's gate and up halves each with their own
// tile grid, edge tiles partial, which is the same layout when I % 128 == 0) and nvfp4 (packed e2m1 pairs, e4m3 scale per 16
// along K, and per expert and matrix the fp32 global scale gs: value = code * scale / gs).
struct Part {
  nb::object obj;
  TensorView t;
};
Part part(nb::object o, const char* what) {
  const Array a = nb::cast<Array>(o);
  return {o, view_of(a, what)};
}

void expect_bytes(const TensorView& t, const char* what, int64_t e, int64_t r, int64_t c, DType dt) {
  if (t.dtype != dt && !(dt == DType::u8 && t.dtype == DType::e4m3) && !(dt == DType::e4m3 && t.dtype == DType::u8))
    throw UsageError(std::string(what) + " is " + t.describe() + "; expected " + dtype_name(dt) +
                     " (uint8 bytes are taken for e4m3)");
  expect_3d(t, what, e, r, c);
}

std::unique_ptr<Weights> quantized_views(WeightFormat f, nb::object w13, nb::object s13, nb::object w2,
                                         nb::object s2, nb::object gs13, nb::object gs2) {
  const Part a = part(w13, "w13"), sa = part(s13, f == WeightFormat::fp8 ? "w13_scale_inv" : "w13_scale");
  const Part b = part(w2, "w2"), sb = part(s2, f == WeightFormat::fp8 ? "w2_scale_inv" : "w2_scale");
  if (a.t.ndim != 3) throw UsageError("w13 is " + a.t.describe() + "; expected [E_loc, 2*I, H(/2 for nvfp4)]");
  const int64_t E = a.t.shape[0], I2 = a.t.shape[1], H = f == WeightFormat::nvfp4 ? a.t.shape[2] * 2 : a.t.shape[2];
  const int64_t I = I2 / 2;
  auto w = std::make_unique<Weights>();
  auto mat = [&](const Part& d, const Part& s, int64_t rows, int64_t cols) {
    MatrixView m;
    m.format = f;
    m.experts = int(E), m.rows = int(rows), m.cols = int(cols);
    m.data = d.t.data;
    m.scales = s.t.data;
    m.device = d.t.device;
    return m;
  };
  for (const Part* p : {&a, &sa, &b, &sb})
    if (p->t.device != a.t.device || p->t.device_index != a.t.device_index)
      throw UsageError("every weight tensor must be on one device; w13 is " + a.t.describe() + ", another " +
                       p->t.describe());
  if (f == WeightFormat::fp8) {
    if (I2 % 2 != 0) throw UsageError("w13 is " + a.t.describe() + "; its rows (gate then up) must be even");
    expect_bytes(a.t, "w13", E, I2, H, DType::e4m3);
    expect_bytes(b.t, "w2", E, H, I, DType::e4m3);
    if (sa.t.dtype != DType::f32 || sb.t.dtype != DType::f32)
      throw UsageError("fp8 scale_inv tensors must be float32 (w13_scale_inv " + sa.t.describe() + ")");
    const int64_t tH = (H + 127) / 128, tI = (I + 127) / 128;
    expect_3d(sa.t, "w13_scale_inv", E, 2 * tI, tH);
    expect_3d(sb.t, "w2_scale_inv", E, tH, tI);
    MatrixView m13 = mat(a, sa, I2, H);
    m13.row_split = int(I);
    w->w = ExpertWeights{int(E), int(H), int(I), m13, mat(b, sb, H, I)};
    w->keep = {w13, s13, w2, s2};
    return w;
  }
  const Part ga = part(gs13, "w13_global_scale"), gb = part(gs2, "w2_global_scale");
  if (H % 16 != 0 || I % 16 != 0) throw UsageError("nvfp4 weights need H and I multiples of 16; w13 is " + a.t.describe());
  expect_bytes(a.t, "w13", E, I2, H / 2, DType::u8);
  expect_bytes(b.t, "w2", E, H, I / 2, DType::u8);
  expect_bytes(sa.t, "w13_scale", E, I2, H / 16, DType::e4m3);
  expect_bytes(sb.t, "w2_scale", E, H, I / 16, DType::e4m3);
  for (const Part* g : {&ga, &gb}) {
    if (g->t.dtype != DType::f32 || g->t.ndim != 1 || g->t.shape[0] != E || g->t.device != a.t.device)
      throw UsageError("nvfp4 global scales must be float32 [" + std::to_string(E) + "] on the weights' device, got " +
                       g->t.describe());
  }
  MatrixView m13 = mat(a, sa, I2, H), m2 = mat(b, sb, H, I);
  m13.global_scale = static_cast<const float*>(ga.t.data);
  m2.global_scale = static_cast<const float*>(gb.t.data);
  w->w = ExpertWeights{int(E), int(H), int(I), m13, m2};
  w->keep = {w13, s13, w2, s2, gs13, gs2};
  return w;
}

// fp32 weights -> the checkpoint tensors of `f` as numpy arrays (for users without a quantized
// checkpoint): the names ExpertWeights.fp8 / .nvfp4 / .bf16 take.
nb::dict quantize_weights(const Array& w13, const Array& w2, nb::handle format) {
  const WeightFormat f = field_value<WeightFormat>(format, "quantize_weights", "format");
  auto w = quantized(w13, w2, format);
  const size_t E = size_t(w->w.num_local_experts), H = size_t(w->w.hidden), I = size_t(w->w.intermediate);
  nb::dict d;
  HostMatrix& a = w->w13_host;
  HostMatrix& b = w->w2_host;
  if (f == WeightFormat::bf16) {
    auto as16 = [](std::vector<uint8_t>& bytes) {
      std::vector<uint16_t> v(bytes.size() / 2);
      std::memcpy(v.data(), bytes.data(), bytes.size());
      return v;
    };
    d["w13"] = numpy_of(as16(a.data), {E, 2 * I, H});
    d["w2"] = numpy_of(as16(b.data), {E, H, I});
  } else if (f == WeightFormat::fp8) {
    auto asf = [](std::vector<uint8_t>& bytes) {
      std::vector<float> v(bytes.size() / 4);
      std::memcpy(v.data(), bytes.data(), bytes.size());
      return v;
    };
    d["w13"] = numpy_of(std::move(a.data), {E, 2 * I, H});
    const size_t tH = (H + 127) / 128, tI = (I + 127) / 128;
    d["w13_scale_inv"] = numpy_of(asf(a.scales), {E, 2 * tI, tH});
    d["w2"] = numpy_of(std::move(b.data), {E, H, I});
    d["w2_scale_inv"] = numpy_of(asf(b.scales), {E, tH, tI});
  } else {
    d["w13"] = numpy_of(std::move(a.data), {E, 2 * I, H / 2});
    d["w13_scale"] = numpy_of(std::move(a.scales), {E, 2 * I, H / 16});
    d["w13_global_scale"] = numpy_of(std::move(a.global_scale), {E});
    d["w2"] = numpy_of(std::move(b.data), {E, H, I / 2});
    d["w2_scale"] = numpy_of(std::move(b.scales), {E, H, I / 16});
    d["w2_global_scale"] = numpy_of(std::move(b.global_scale), {E});
  }
  return d;
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
  m.def("local_comm", [](const std::string& device, int index) {
    if (device != "cpu" && device != "cuda")
      throw UsageError("local_comm(device='" + device + "'): use 'cpu' or 'cuda'");
    return make_local_comm(device == "cuda" ? DeviceKind::cuda : DeviceKind::cpu, index);
  }, nb::arg("device") = "cpu", nb::arg("index") = 0,
        "The single-rank communicator (dispatcher 'local'): the CPU reference, or one CUDA device.");
  m.def("cpu_group", [](int num_ranks, int timeout_ms) {
    if (num_ranks < 1) throw UsageError("cpu_group(num_ranks=" + std::to_string(num_ranks) + "): needs at least 1 rank");
    return make_cpu_group(num_ranks, timeout_ms);
  }, nb::arg("num_ranks"), nb::arg("timeout_ms") = 10000,
        "R simulated ranks in this process (one communicator each; run each rank on its own thread).");

#if defined(EPMOE_WITH_NCCL)
  m.def("nccl_unique_id", [] {
    const ncclUniqueId id = make_nccl_unique_id();
    return nb::bytes(id.internal, sizeof id.internal);
  }, "A fresh NCCL id (bytes): make it on one rank and hand it to all others.");
  m.def("nccl_comm", [](nb::bytes id, int rank, int world, int device, int timeout_ms) {
    if (id.size() != sizeof(ncclUniqueId::internal))
      throw UsageError("nccl_comm(id=...): the id has " + std::to_string(id.size()) + " bytes, NCCL ids have " +
                       std::to_string(sizeof(ncclUniqueId::internal)) + "; pass what nccl_unique_id() returned");
    ncclUniqueId u{};
    std::memcpy(u.internal, id.c_str(), sizeof u.internal);
    nb::gil_scoped_release unlocked;  // collective: blocks until every rank has called it
    return make_nccl_comm(u, rank, world, device, timeout_ms);
  }, nb::arg("id"), nb::arg("rank"), nb::arg("world"), nb::arg("device"), nb::arg("timeout_ms") = 10000,
        "Rank `rank` of `world` on CUDA device `device` (one process per GPU). Collective.");
  m.def("adopt_nccl_comm", [](uintptr_t comm, int timeout_ms) {
    nb::gil_scoped_release unlocked;
    return adopt_nccl_comm(reinterpret_cast<ncclComm_t>(comm), timeout_ms);
  }, nb::arg("comm"), nb::arg("timeout_ms") = 10000,
        "Wraps an ncclComm_t the caller owns (its address as an int, e.g. from torchcomms' get_nccl_comm_ptr()): "
        "rank, size and device from NCCL; epmoe never destroys it, so keep it alive longer than every layer on it.");
  m.def("nccl_group", [](std::vector<int> devices, int timeout_ms) {
    nb::gil_scoped_release unlocked;
    return make_nccl_group(std::move(devices), timeout_ms);
  }, nb::arg("devices"), nb::arg("timeout_ms") = 10000,
        "One communicator per listed GPU, driven by threads of this process (see run_ranks).");
  m.def("nccl_versions", [] { return std::make_pair(nccl_compiled_version(), nccl_runtime_version()); },
        "(NCCL the device code was compiled against, NCCL loaded now).");
  m.def("_nccl_version_problem", []() -> std::string {
    const std::string built = nccl_compiled_version(), loaded = nccl_runtime_version();
    if (built == loaded || env::nccl_allow_version_mismatch()) return "";
    return "epmoe was built against NCCL " + built + " but NCCL " + loaded +
           " is loaded in this process (importing torch first loads PyTorch's copy); NCCL's device API is "
           "inlined from the headers, so the two must match. Build epmoe against the NCCL you run with: "
           "EPMOE_NCCL_ROOT=<its prefix, e.g. torch's site-packages/nvidia/nccl> pip install .";
  });
#endif

  nb::class_<Weights>(m, "ExpertWeights", "One rank's experts: W13 [E_loc, 2I, H] (gate rows, then up) and W2 [E_loc, H, I].")
      .def_static("quantize", &quantized, nb::arg("w13"), nb::arg("w2"), nb::arg("format"),
                  "float32 CPU arrays quantized on the host into the weight format (bf16, fp8 or nvfp4).")
      .def_static("bf16", &bf16_views, nb::arg("w13"), nb::arg("w2"),
                  "bfloat16 tensors (uint16 bits for numpy) used in place, on the CPU or one CUDA device.")
      .def_static("fp8",
                  [](nb::object w13, nb::object w13_scale_inv, nb::object w2, nb::object w2_scale_inv) {
                    return quantized_views(WeightFormat::fp8, w13, w13_scale_inv, w2, w2_scale_inv, nb::none(),
                                           nb::none());
                  },
                  nb::arg("w13"), nb::arg("w13_scale_inv"), nb::arg("w2"), nb::arg("w2_scale_inv"),
                  "DeepSeek-V3/R1 fp8 checkpoint tensors used in place: e4m3 codes [E,2I,H] / [E,H,I] and float32 "
                  "weight_scale_inv per 128x128 tile [E,2*ceil(I/128),ceil(H/128)] (gate and up tiled apart) / "
                  "[E,ceil(H/128),ceil(I/128)].")
      .def_static("nvfp4",
                  [](nb::object w13, nb::object w13_scale, nb::object w13_gs, nb::object w2, nb::object w2_scale,
                     nb::object w2_gs) {
                    return quantized_views(WeightFormat::nvfp4, w13, w13_scale, w2, w2_scale, w13_gs, w2_gs);
                  },
                  nb::arg("w13"), nb::arg("w13_scale"), nb::arg("w13_global_scale"), nb::arg("w2"),
                  nb::arg("w2_scale"), nb::arg("w2_global_scale"),
                  "nvfp4 tensors used in place: packed e2m1 pairs (uint8, element 2i in the low nibble) "
                  "[E,2I,H/2] / [E,H,I/2], e4m3 scales per 16 [E,2I,H/16] / [E,H,I/16], and float32 global scales "
                  "gs [E] per matrix (value = code * scale / gs; ModelOpt's weight_scale_2 is 1/gs).")
      .def_prop_ro("num_local_experts", [](const Weights& w) { return w.w.num_local_experts; })
      .def_prop_ro("hidden", [](const Weights& w) { return w.w.hidden; })
      .def_prop_ro("intermediate", [](const Weights& w) { return w.w.intermediate; })
      .def_prop_ro("format", [](const Weights& w) { return w.w.w13.format; })
      .def_prop_ro("nbytes", [](const Weights& w) {
        return w.w.w13.data_bytes() + w.w.w13.scale_bytes() + w.w.w2.data_bytes() + w.w.w2.scale_bytes();
      });

  m.def("quantize_weights", &quantize_weights, nb::arg("w13"), nb::arg("w2"), nb::arg("format"),
        "float32 [E,2I,H] / [E,H,I] -> dict of numpy arrays in the checkpoint layout of `format` (the keyword "
        "arguments of ExpertWeights.bf16 / .fp8 / .nvfp4), quantized as epmoe quantizes.");

  nb::class_<MoeLayer>(m, "MoeLayer", "One rank's share of an expert-parallel MoE layer.")
      .def("__init__",
           [](MoeLayer* self, const MoeConfig& cfg, Communicator& comm, const Weights& w, nb::object bias) {
             const float* b = nullptr;
             if (!bias.is_none()) {
               const TensorView t = view_of(nb::cast<Array>(bias), "router_bias");
               if (t.dtype != DType::f32 || t.ndim != 1 || t.shape[0] != cfg.num_experts || !t.is_contiguous())
                 throw UsageError("router_bias is " + t.describe() + "; expected contiguous f32[" +
                                  std::to_string(cfg.num_experts) + "] on the weights' device");
               b = static_cast<const float*>(t.data);
             }
             nb::gil_scoped_release unlocked;  // collective: the other ranks' threads must run
             new (self) MoeLayer(cfg, comm, w.w, b);
           },
           nb::arg("config"), nb::arg("comm"), nb::arg("weights"), nb::arg("router_bias") = nb::none(),
           nb::keep_alive<1, 3>(), nb::keep_alive<1, 4>(), nb::keep_alive<1, 5>())
      .def_prop_ro("rank", &MoeLayer::rank)
      .def_prop_ro("config", [](const MoeLayer& l) { return l.config(); })
      .def_prop_ro("device", [](const MoeLayer& l) { return std::string(device_name(l.device())); })
      .def_prop_ro("device_index", &MoeLayer::device_index)
      .def("_forward",
           [](MoeLayer& l, const Array& hidden, const Array& logits, const Array& out, uintptr_t stream) {
             const TensorView h = view_of(hidden, "hidden"), g = view_of(logits, "router_logits"),
                              o = view_of(out, "out");
             nb::gil_scoped_release unlocked;
             l.forward(h, g, o, reinterpret_cast<Stream>(stream));
           },
           nb::arg("hidden"), nb::arg("router_logits"), nb::arg("out"), nb::arg("stream") = 0)
      .def("_bench_forward",
           [](MoeLayer& l, const Array& hidden, const Array& logits, const Array& out, uintptr_t stream, int iters,
              int burst, bool device_time) {
             // The same forward called from C++ in a loop: the baseline of the Python overhead
             // benchmark (epmoe.bench). device_us: CUDA-event time per call over `iters` calls back
             // to back. host_us: the median, over rounds of `burst` calls each started on an idle
             // stream, of the enqueue time per call; short rounds keep the launch queue from filling,
             // which would make the host wait for the GPU and time the GPU instead. On the CPU backend
             // both are the host time. device_time = false: host rounds only (device_us = 0).
             if (iters < 1) throw UsageError("_bench_forward(iters=" + std::to_string(iters) + "): give 1 or more");
             if (burst < 1) throw UsageError("_bench_forward(burst=" + std::to_string(burst) + "): give 1 or more");
             const TensorView h = view_of(hidden, "hidden"), g = view_of(logits, "router_logits"),
                              o = view_of(out, "out");
             double host_us = 0, device_us = 0;
             {
               nb::gil_scoped_release unlocked;
               const Stream st = reinterpret_cast<Stream>(stream);
               using clock = std::chrono::steady_clock;
#if defined(EPMOE_WITH_CUDA)
               const bool gpu = h.device == DeviceKind::cuda;
#else
               const bool gpu = false;
#endif
               if (gpu) {
#if defined(EPMOE_WITH_CUDA)
                 auto cs = static_cast<cudaStream_t>(st);
                 std::vector<double> per_call;
                 for (int done = 0; done < iters; done += burst) {
                   EPMOE_CUDA_CHECK(cudaStreamSynchronize(cs));
                   const auto t0 = clock::now();
                   for (int i = 0; i < burst; ++i) l.forward(h, g, o, st);
                   per_call.push_back(std::chrono::duration<double, std::micro>(clock::now() - t0).count() / burst);
                 }
                 std::sort(per_call.begin(), per_call.end());
                 host_us = per_call[per_call.size() / 2];
                 if (device_time) {
                   cudaEvent_t a = nullptr, b = nullptr;
                   EPMOE_CUDA_CHECK(cudaEventCreate(&a));
                   EPMOE_CUDA_CHECK(cudaEventCreate(&b));
                   EPMOE_CUDA_CHECK(cudaEventRecord(a, cs));
                   for (int i = 0; i < iters; ++i) l.forward(h, g, o, st);
                   EPMOE_CUDA_CHECK(cudaEventRecord(b, cs));
                   EPMOE_CUDA_CHECK(cudaEventSynchronize(b));
                   float ms = 0.f;
                   EPMOE_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
                   device_us = 1e3 * ms / iters;
                   cudaEventDestroy(a);
                   cudaEventDestroy(b);
                 }
#endif
               } else {
                 const auto t0 = clock::now();
                 for (int i = 0; i < iters; ++i) l.forward(h, g, o, st);
                 host_us = device_us = std::chrono::duration<double, std::micro>(clock::now() - t0).count() / iters;
               }
             }
             nb::dict d;
             d["host_us"] = host_us;
             d["device_us"] = device_us;
             return d;
           },
           nb::arg("hidden"), nb::arg("router_logits"), nb::arg("out"), nb::arg("stream") = 0, nb::arg("iters") = 100,
           nb::arg("burst") = 8, nb::arg("device_time") = true)
      .def("_forward_routed",
           [](MoeLayer& l, const Array& hidden, const Array& ids, const Array& weights, const Array& out,
              uintptr_t stream) {
             const TensorView h = view_of(hidden, "hidden"), i = view_of(ids, "topk_ids"),
                              w = view_of(weights, "topk_weights"), o = view_of(out, "out");
             nb::gil_scoped_release unlocked;
             l.forward_routed(h, i, w, o, reinterpret_cast<Stream>(stream));
           },
           nb::arg("hidden"), nb::arg("topk_ids"), nb::arg("topk_weights"), nb::arg("out"), nb::arg("stream") = 0)
      .def(
          "fault_counts",
          [](const MoeLayer& l, uintptr_t stream) {
            FaultCounts f;
            {
              nb::gil_scoped_release unlocked;
              f = l.fault_counts(reinterpret_cast<Stream>(stream));
            }
            nb::dict d;
            d["nonfinite_hidden"] = f.nonfinite_hidden;
            d["nonfinite_logits"] = f.nonfinite_logits;
            d["nonfinite_weights"] = f.nonfinite_weights;
            d["bad_ids"] = f.bad_ids;
            return d;
          },
          nb::arg("stream") = 0,
          "The data faults counted so far (DESIGN.md section 7), as a dict: nonfinite_hidden, nonfinite_logits, "
          "nonfinite_weights (tokens) and bad_ids (entries). Waits for `stream`, the forwards' stream.")
      .def(
          "reset_fault_counts",
          [](MoeLayer& l, uintptr_t stream) { l.reset_fault_counts(reinterpret_cast<Stream>(stream)); },
          nb::arg("stream") = 0, "Zeroes the fault counters, ordered on `stream`.");
}

}  // namespace epmoe::py
