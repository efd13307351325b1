// MoeLayer: one rank's share of the layer. It checks arguments, routes when given logits, and
// runs the registered step (dispatch -> run -> combine) of the configured backend pair.
#include "epmoe/layer.h"

#include <string>
#include <vector>

#include "epmoe/error.h"
#include "epmoe/registry.h"
#include "epmoe/router.h"
#include "layer/faults.h"

#if defined(EPMOE_WITH_CUDA)
#include <cuda_runtime.h>

#include "core/cuda/check.h"
#include "layer/cuda/faults.h"
#include "route/cuda/route.h"
#endif

namespace epmoe {

namespace {

std::string dims(const MatrixView& m) {
  std::string s = "[";
  s += std::to_string(m.experts);
  s += "][";
  s += std::to_string(m.rows);
  s += "][";
  s += std::to_string(m.cols);
  s += "]";
  return s;
}

void check_weights(const MoeConfig& cfg, const ExpertWeights& w, DeviceKind device) {
  const int El = cfg.experts_per_rank(), H = cfg.hidden, I = cfg.intermediate;
  auto fail = [](const std::string& msg) { throw UsageError("MoeLayer weights: " + msg); };
  if (w.num_local_experts != El || w.hidden != H || w.intermediate != I)
    fail("num_local_experts=" + std::to_string(w.num_local_experts) + " hidden=" + std::to_string(w.hidden) +
         " intermediate=" + std::to_string(w.intermediate) + " do not match the configuration (" + std::to_string(El) +
         ", " + std::to_string(H) + ", " + std::to_string(I) + "); build this rank's weights for the config's placement");
  const struct {
    const MatrixView& m;
    const char* name;
    int rows, cols, split;
  } mats[] = {{w.w13, "w13", 2 * I, H, I}, {w.w2, "w2", H, I, 0}};
  for (const auto& x : mats) {
    if (x.m.experts != El || x.m.rows != x.rows || x.m.cols != x.cols)
      fail(std::string(x.name) + " is " + dims(x.m) + ", expected [" + std::to_string(El) + "][" +
           std::to_string(x.rows) + "][" + std::to_string(x.cols) + "] (E_loc, rows, cols)");
    if (x.m.format != cfg.weight_format)
      fail(std::string(x.name) + " has format " + format_name(x.m.format) + " but weight_format=" +
           format_name(cfg.weight_format) + "; quantize the weights to the configured format or change the config");
    if (x.m.device != device)
      fail(std::string(x.name) + " is on " + device_name(x.m.device) + " but the runner needs weights on " +
           device_name(device));
    if (El > 0 && x.m.data == nullptr) fail(std::string(x.name) + ".data is null");
    if (!row_split_ok(x.m, x.split)) fail(row_split_error(x.name, x.m, x.split));
  }
}

#if defined(EPMOE_WITH_CUDA)
// Grows `buf` to `bytes` on device `dev`, whatever device is current.
void reserve_on(cuda::DeviceBuffer& buf, size_t bytes, int dev) {
  if (bytes <= buf.size()) return;
  cuda::DeviceGuard guard(dev);
  buf.reserve(bytes);
}
#endif

}  // namespace

struct MoeLayer::Impl {
  MoeConfig cfg;
  Communicator& comm;
  ExpertWeights weights;
  const float* router_bias;
  Registry::Pair pair;
  std::unique_ptr<Dispatcher> dispatcher;
  std::unique_ptr<Runner> runner;
  DeviceKind device = DeviceKind::cpu;

  // Host scratch (cpu device): y [R][C][H], routed ids/weights.
  std::vector<bf16_raw> y_host;
  std::vector<int32_t> ids_host;
  std::vector<float> w_host;
#if defined(EPMOE_WITH_CUDA)
  cuda::DeviceBuffer y_dev, ids_dev, w_dev;
  cuda::DeviceBuffer faults_dev;  // unsigned long long [kFaultKinds]
#endif
  int64_t faults_host[detail::kFaultKinds] = {};  // the CPU backend's counters
  int64_t faults_seen[detail::kFaultKinds] = {};  // fault_check = raise: the counts already raised on

  Impl(const MoeConfig& c, Communicator& cm, const ExpertWeights& w, const float* bias)
      : cfg(c), comm(cm), weights(w), router_bias(bias) {}

  bf16_raw* y() {
#if defined(EPMOE_WITH_CUDA)
    if (device == DeviceKind::cuda) return y_dev.get<bf16_raw>();
#endif
    return y_host.data();
  }

  // Shape and placement errors are local to one rank, but every rank must fail together or the
  // others would wait in dispatch until their timeout. On the cpu fabric one extra agreement round
  // is cheap, so every rank learns that some rank's input was bad; the rank with the bad input
  // reports its own message. On GPU communicators only the dispatcher's collective checks (T > C,
  // ids) are shared, to keep the forward free of host round trips.
  void agree_on_input(const std::string& local_error) {
    if (comm.size() > 1 && comm.device() == DeviceKind::cpu) {
      try {
        comm.check_same(local_error.empty() ? 0 : 1, "forward input check (0 = ok, 1 = bad input)");
      } catch (const UsageError&) {
        if (!local_error.empty()) throw UsageError(local_error);
        throw;
      }
    }
    if (!local_error.empty()) throw UsageError(local_error);
  }

  // The scan of a forward's hidden rows; the caller adds logits or ids and weights.
  detail::FaultScan hidden_scan(int64_t T, const TensorView& hidden) const {
    detail::FaultScan scan;
    scan.tokens = T;
    scan.hidden = cfg.hidden;
    scan.x = hidden.as<const uint16_t>();
    scan.num_experts = cfg.num_experts;
    scan.top_k = cfg.top_k;
    return scan;
  }

  // Counts the data faults of this forward's inputs (DESIGN.md §7): on the device without host
  // synchronization, or on the host for the CPU backend.
  void scan_faults(const detail::FaultScan& scan, Stream stream) {
    if (cfg.tuning.fault_check == FaultCheck::off || scan.tokens <= 0) return;
    if (device == DeviceKind::cpu) {
      detail::scan_faults_host(scan, faults_host);
      return;
    }
#if defined(EPMOE_WITH_CUDA)
    cuda::DeviceGuard g(comm.device_index());
    cuda::scan_faults(scan, faults_dev.get<unsigned long long>(), static_cast<cudaStream_t>(stream));
#endif
  }

  void read_faults(int64_t* out, Stream stream) const {
    if (device == DeviceKind::cpu) {
      for (int i = 0; i < detail::kFaultKinds; ++i) out[i] = faults_host[i];
      return;
    }
#if defined(EPMOE_WITH_CUDA)
    cuda::DeviceGuard g(comm.device_index());
    unsigned long long v[detail::kFaultKinds] = {};
    auto st = static_cast<cudaStream_t>(stream);
    EPMOE_CUDA_CHECK(cudaMemcpyAsync(v, faults_dev.get(), sizeof(v), cudaMemcpyDeviceToHost, st));
    EPMOE_CUDA_CHECK(cudaStreamSynchronize(st));
    for (int i = 0; i < detail::kFaultKinds; ++i) out[i] = int64_t(v[i]);
#endif
  }

  // fault_check = raise: waits for the forward's stream; the faults met since the last check are
  // an error (the outputs are already written, by the rule of §7).
  void refuse_capture_in_raise_mode(Stream stream) const {
#if defined(EPMOE_WITH_CUDA)
    if (cfg.tuning.fault_check != FaultCheck::raise || device != DeviceKind::cuda) return;
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    EPMOE_CUDA_CHECK(cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &cap));
    if (cap != cudaStreamCaptureStatusNone)
      throw UsageError("MoeLayer: tuning.fault_check=raise waits for the stream after each forward, which a stream "
                       "that is capturing a CUDA graph cannot do; build the layer with fault_check=count and read "
                       "fault_counts() after the replays");
#else
    (void)stream;
#endif
  }

  void raise_on_faults(const char* call, Stream stream) {
    if (cfg.tuning.fault_check != FaultCheck::raise) return;
    int64_t now[detail::kFaultKinds], delta[detail::kFaultKinds];
    read_faults(now, stream);
    bool any = false;
    for (int i = 0; i < detail::kFaultKinds; ++i) {
      delta[i] = now[i] - faults_seen[i];
      faults_seen[i] = now[i];
      any |= delta[i] > 0;
    }
    if (any)
      throw UsageError(std::string("MoeLayer.") + call + " (tuning.fault_check=raise): rank " +
                       std::to_string(comm.rank()) + " met " + detail::fault_message(delta, cfg.num_experts) +
                       "; those tokens' outputs follow the rule of DESIGN.md section 7 and the other tokens are "
                       "unaffected; fix the inputs, or use fault_check=count and read fault_counts()");
  }

  void step(int64_t T, const TensorView& hidden, const int32_t* ids, const float* w, const TensorView& out,
            Stream stream) {
    StepContext ctx{*dispatcher, *runner, weights, y()};
    DispatchInput in;
    in.num_tokens = T;
    in.hidden = hidden.as<const bf16_raw>();
    in.topk_ids = ids;
    in.topk_weights = w;
    in.stream = stream;
    pair.step(ctx, in, out.as<bf16_raw>());
  }
};

MoeLayer::MoeLayer(const MoeConfig& cfg, Communicator& comm, const ExpertWeights& weights, const float* router_bias)
    : impl_(std::make_unique<Impl>(cfg, comm, weights, router_bias)) {
  validate_or_throw(cfg);
  Impl& s = *impl_;
  s.pair = Registry::global().resolve(cfg);
  s.device = s.pair.runner->device;
  if (comm.size() != cfg.num_ranks)
    throw UsageError("MoeLayer: the communicator has " + std::to_string(comm.size()) + " ranks but num_ranks=" +
                     std::to_string(cfg.num_ranks) + "; create the group with num_ranks ranks");
  bool kind_ok = false;
  std::string kinds;
  for (const auto& k : s.pair.dispatcher->comm_kinds) {
    kind_ok |= (k == comm.kind());
    kinds += (kinds.empty() ? "" : ", ") + k;
  }
  if (!kind_ok)
    throw UsageError("MoeLayer: dispatcher=" + cfg.dispatcher + " runs on communicators of kind " + kinds +
                     ", but this one is '" + comm.kind() + "'; create a matching communicator or pick another dispatcher");
  if (comm.device() != s.device)
    throw UsageError(std::string("MoeLayer: the communicator's ranks live on ") + device_name(comm.device()) +
                     " but runner=" + cfg.runner + " runs on " + device_name(s.device) +
                     "; pick a runner for that device");
  check_weights(cfg, weights, s.device);

  const size_t y_elems = size_t(cfg.num_ranks) * cfg.capacity * cfg.hidden;
  if (s.device == DeviceKind::cpu) {
    s.y_host.assign(y_elems, 0);
  } else {
#if defined(EPMOE_WITH_CUDA)
    reserve_on(s.y_dev, y_elems * sizeof(bf16_raw), comm.device_index());
    reserve_on(s.ids_dev, size_t(cfg.capacity) * cfg.top_k * sizeof(int32_t), comm.device_index());
    reserve_on(s.w_dev, size_t(cfg.capacity) * cfg.top_k * sizeof(float), comm.device_index());
    reserve_on(s.faults_dev, detail::kFaultKinds * sizeof(unsigned long long), comm.device_index());
    {
      cuda::DeviceGuard g(comm.device_index());
      EPMOE_CUDA_CHECK(cudaMemset(s.faults_dev.get(), 0, detail::kFaultKinds * sizeof(unsigned long long)));
    }
#else
    throw UsageError("MoeLayer: runner=" + cfg.runner + " needs CUDA, which this build does not have");
#endif
  }
  // Collective: the dispatcher checks the configuration fingerprint with every rank.
  s.dispatcher = s.pair.dispatcher->create(cfg, comm);
  s.runner = s.pair.runner->create(cfg, comm.device_index());
  // The backend's one-time conversion of the weights (e.g. nvfp4 into the cuda runner's decode
  // layout); every step then passes the prepared weights.
  s.runner->prepare(s.weights, nullptr);
}

MoeLayer::~MoeLayer() = default;

const MoeConfig& MoeLayer::config() const { return impl_->cfg; }
int MoeLayer::rank() const { return impl_->comm.rank(); }
DeviceKind MoeLayer::device() const { return impl_->device; }
int MoeLayer::device_index() const { return impl_->comm.device_index(); }

void MoeLayer::forward(const TensorView& hidden, const TensorView& router_logits, const TensorView& out,
                       Stream stream) {
  Impl& s = *impl_;
  const MoeConfig& c = s.cfg;
  const int K = c.top_k;
  std::string err;
  int64_t T = 0;
  try {
    const int index = s.comm.device_index();
    check_tensor(hidden, "hidden", DType::bf16, {-1, c.hidden}, s.device, index);
    T = hidden.size(0);
    check_tensor(router_logits, "router_logits", router_logits.dtype == DType::bf16 ? DType::bf16 : DType::f32,
                 {T, c.num_experts}, s.device, index);
    check_tensor(out, "out", DType::bf16, {T, c.hidden}, s.device, index);
  } catch (const UsageError& e) {
    err = e.what();
  }
  s.agree_on_input(err);
  s.refuse_capture_in_raise_mode(stream);
  detail::FaultScan scan = s.hidden_scan(T, hidden);
  scan.logits = router_logits.data;
  scan.logits_bf16 = router_logits.dtype == DType::bf16;

  if (s.device == DeviceKind::cpu) {
    s.ids_host.resize(size_t(T) * K);
    s.w_host.resize(size_t(T) * K);
    route_cpu(c.router, router_logits, s.router_bias, K, s.ids_host.data(), s.w_host.data());
    scan.weights = s.w_host.data();
    s.scan_faults(scan, stream);
    s.step(T, hidden, s.ids_host.data(), s.w_host.data(), out, stream);
    s.raise_on_faults("forward", stream);
    return;
  }
#if defined(EPMOE_WITH_CUDA)
  // T > C is reported by the dispatcher on every rank; the scratch grows so routing stays in bounds.
  reserve_on(s.ids_dev, size_t(T) * K * sizeof(int32_t), s.comm.device_index());
  reserve_on(s.w_dev, size_t(T) * K * sizeof(float), s.comm.device_index());
  auto* ids = s.ids_dev.get<int32_t>();
  auto* w = s.w_dev.get<float>();
  cuda::route(c.router, router_logits, s.router_bias, K, ids, w, static_cast<cudaStream_t>(stream));
  scan.weights = w;  // the router's ids are always in range; its weights carry NaN/inf logits' outcome
  s.scan_faults(scan, stream);
  s.step(T, hidden, ids, w, out, stream);
  s.raise_on_faults("forward", stream);
#else
  throw UsageError("MoeLayer: CUDA routing not built");
#endif
}

void MoeLayer::forward_routed(const TensorView& hidden, const TensorView& topk_ids, const TensorView& topk_weights,
                              const TensorView& out, Stream stream) {
  Impl& s = *impl_;
  const MoeConfig& c = s.cfg;
  std::string err;
  int64_t T = 0;
  try {
    const int index = s.comm.device_index();
    check_tensor(hidden, "hidden", DType::bf16, {-1, c.hidden}, s.device, index);
    T = hidden.size(0);
    check_tensor(topk_ids, "topk_ids", DType::i32, {T, c.top_k}, s.device, index);
    check_tensor(topk_weights, "topk_weights", DType::f32, {T, c.top_k}, s.device, index);
    check_tensor(out, "out", DType::bf16, {T, c.hidden}, s.device, index);
    // Host ids are checked here so the message names the token; the dispatcher checks again
    // (collectively, and on devices where the ids cannot be read from the host).
    if (s.device == DeviceKind::cpu) check_topk_ids(topk_ids.as<const int32_t>(), T, c.top_k, c.num_experts);
  } catch (const UsageError& e) {
    err = e.what();
  }
  s.agree_on_input(err);
  s.refuse_capture_in_raise_mode(stream);
  detail::FaultScan scan = s.hidden_scan(T, hidden);
  scan.ids = topk_ids.as<const int32_t>();
  scan.weights = topk_weights.as<const float>();
  s.scan_faults(scan, stream);
  s.step(T, hidden, topk_ids.as<const int32_t>(), topk_weights.as<const float>(), out, stream);
  s.raise_on_faults("forward_routed", stream);
}

FaultCounts MoeLayer::fault_counts(Stream stream) const {
  int64_t v[detail::kFaultKinds];
  impl_->read_faults(v, stream);
  FaultCounts f;
  f.nonfinite_hidden = v[detail::kNonfiniteHidden];
  f.nonfinite_logits = v[detail::kNonfiniteLogits];
  f.nonfinite_weights = v[detail::kNonfiniteWeights];
  f.bad_ids = v[detail::kBadIds];
  return f;
}

void MoeLayer::reset_fault_counts(Stream stream) {
  Impl& s = *impl_;
  for (int i = 0; i < detail::kFaultKinds; ++i) s.faults_host[i] = s.faults_seen[i] = 0;
#if defined(EPMOE_WITH_CUDA)
  if (s.device == DeviceKind::cuda) {
    cuda::DeviceGuard g(s.comm.device_index());
    EPMOE_CUDA_CHECK(cudaMemsetAsync(s.faults_dev.get(), 0, detail::kFaultKinds * sizeof(unsigned long long),
                                     static_cast<cudaStream_t>(stream)));
  }
#else
  (void)stream;
#endif
}

}  // namespace epmoe
