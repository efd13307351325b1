// Host-memory ranks of `epmoe run` (device cpu).
#include <algorithm>
#include <chrono>
#include <list>

#include "bench_util.h"
#include "comm/launch.h"
#include "rank_io.h"

namespace epmoe::cli {

namespace {

class HostIO : public RankIO {
 public:
  MatrixView put(const HostMatrix& m) override { return held_m_.emplace_back(m).view(); }
  const float* put(const std::vector<float>& v) override { return held_f_.emplace_back(v).data(); }
  void release() override {
    held_m_.clear();
    held_f_.clear();
  }
  double forward(MoeLayer& layer, const std::vector<bf16_raw>& h, const std::vector<float>& logits,
                 std::vector<bf16_raw>& out, int64_t T, int H, int E, int reps, bool warm_up) override {
    out.assign(size_t(T) * H, bf16_raw{});
    const auto hv = TensorView::of(const_cast<bf16_raw*>(h.data()), DType::bf16, {T, H});
    const auto lv = TensorView::of(const_cast<float*>(logits.data()), DType::f32, {T, E});
    const auto ov = TensorView::of(out.data(), DType::bf16, {T, H});
    if (warm_up) layer.forward(hv, lv, ov);
    std::vector<double> ms;
    for (int i = 0; i < std::max(1, reps); ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      layer.forward(hv, lv, ov);
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    return median(ms);
  }

 private:
  std::list<HostMatrix> held_m_;  // a list: views stay valid while more is put
  std::list<std::vector<float>> held_f_;
};

}  // namespace

std::unique_ptr<RankIO> make_host_io() { return std::make_unique<HostIO>(); }

}  // namespace epmoe::cli
