// Weight preparation of runner "cuda" (prepare.h).
#include "run/cuda/prepare.h"

#include "run/cuda/engine.h"
#include "run/cuda/engine_cutlass.h"

namespace epmoe::cuda {

size_t prepare_nvfp4_weights(ExpertWeights& w, DeviceBuffer& w13, DeviceBuffer& w2, cudaStream_t stream) {
  if (w.w13.format != WeightFormat::nvfp4) return 0;
  const int H = w.hidden, I = w.intermediate;
  size_t bytes = 0;
  if (wgmma_nvfp4_supports(H, I, true, true)) {
    const size_t n = nvfp4_prepared_bytes(w.w13, true, I);
    w13.reserve(n);
    prepare_nvfp4_weights(w.w13, true, I, w13.get(), stream);
    w.w13.prepared = w13.get();
    bytes += n;
  }
  if (w.w2.format == WeightFormat::nvfp4 && wgmma_nvfp4_supports(I, H, false, true)) {
    const size_t n = nvfp4_prepared_bytes(w.w2, false, H);
    w2.reserve(n);
    prepare_nvfp4_weights(w.w2, false, H, w2.get(), stream);
    w.w2.prepared = w2.get();
    bytes += n;
  }
  return bytes;
}

size_t prepare_fp8_glu_scales(ExpertWeights& w, DeviceBuffer& scales, cudaStream_t stream) {
  const int E = w.w13.experts, H = w.hidden, I = w.intermediate;
  if (w.w13.format != WeightFormat::fp8 || !cutlass_engine::glu_fp8_fits(I) || E <= 0) return 0;
  const size_t n = fp8_glu_scales_bytes(E, H, I);
  scales.reserve(n);
  cutlass_engine::glu_fp8_scales(static_cast<const float*>(w.w13.scales), E, I, H, scales.get<float>(), stream);
  w.w13.prepared = scales.get();
  return n;
}

size_t prepare_fp8_row_scales(ExpertWeights& w, DeviceBuffer& rows13, DeviceBuffer& rows2, cudaStream_t stream) {
  const int E = w.w13.experts, H = w.hidden, I = w.intermediate;
  if (w.w13.format != WeightFormat::fp8 || w.w2.format != WeightFormat::fp8 || E <= 0) return 0;
  const size_t n13 = cutlass_engine::fp8w_scales_bytes(E, 2 * I, H), n2 = cutlass_engine::fp8w_scales_bytes(E, H, I);
  rows13.reserve(n13);
  rows2.reserve(n2);
  cutlass_engine::expand_fp8_scales(static_cast<const float*>(w.w13.scales), E, 2 * I, H, I, rows13.get<float>(),
                                    stream);
  cutlass_engine::expand_fp8_scales(static_cast<const float*>(w.w2.scales), E, H, I, H, rows2.get<float>(), stream);
  w.w2.prepared = rows2.get();
  return n13 + n2;
}

size_t prepare_nvfp4_paired(const ExpertWeights& w, DeviceBuffer& w13, DeviceBuffer& w2, cudaStream_t stream,
                            bool glu_order) {
  if (w.w13.format != WeightFormat::nvfp4 || w.w2.format != WeightFormat::nvfp4 || w.w13.experts <= 0) return 0;
  if (w.hidden % 16 != 0 || w.intermediate % 16 != 0) return 0;
  const size_t n13 = cutlass_engine::nvfp4_paired_bytes(w.w13), n2 = cutlass_engine::nvfp4_paired_bytes(w.w2);
  w13.reserve(n13);
  w2.reserve(n2);
  DeviceBuffer flag(sizeof(int));
  EPMOE_CUDA_CHECK(cudaMemsetAsync(flag.get(), 0, sizeof(int), stream));
  cutlass_engine::write_nvfp4_paired(w.w13, w13.get<uint8_t>(), flag.get<int>(), stream, glu_order);
  cutlass_engine::write_nvfp4_paired(w.w2, w2.get<uint8_t>(), flag.get<int>(), stream);
  int nan_seen = 0;
  EPMOE_CUDA_CHECK(cudaMemcpyAsync(&nan_seen, flag.get(), sizeof(int), cudaMemcpyDeviceToHost, stream));
  EPMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (!nan_seen) return n13 + n2;
  w13.release();
  w2.release();
  return 0;
}

}  // namespace epmoe::cuda
