#include "dispatch/cuda/local.h"

#include <string>
#include <vector>

#include "dispatch/check.h"
#include "dispatch/output.h"
#include "epmoe/error.h"
#include "epmoe/numeric.h"
#include "quant/cuda/quant.h"
#include "quant/cuda/quant_device.cuh"

namespace epmoe::cuda {
namespace {

constexpr int kPlanThreads = 1024;


// placement.choose(e, src = 0, t) on the flattened map.
__device__ __forceinline__ int32_t choose_slot(const int32_t* off, const int32_t* ranks, const int32_t* slots, int e,
                                               int64_t t) {
  const int b = off[e], n = off[e + 1] - b;
  if (n == 1) return slots[b];
  for (int i = 0; i < n; ++i)
    if (ranks[b + i] == 0) return slots[b + i];
  return slots[b + static_cast<int>(t % n)];  // unreachable for R = 1: every copy is on rank 0
}

// One CTA: deterministic slot assignment (slot = rank of the token among tokens with a valid id),
// routing rows translated to local slots, per-expert counts. Thread i owns a contiguous chunk of
// tokens so that the block scan keeps ascending token order.
__global__ void __launch_bounds__(kPlanThreads) plan_kernel(
    const int32_t* __restrict__ topk_ids, const float* __restrict__ topk_w, int64_t T, int K, int E, int C,
    const int32_t* __restrict__ off, const int32_t* __restrict__ ranks, const int32_t* __restrict__ slots,
    int32_t* __restrict__ local_ids, float* __restrict__ weights, int32_t* __restrict__ counts,
    int32_t* __restrict__ expert_counts, int32_t* __restrict__ prev_n, int32_t* __restrict__ slot_of_token,
    int32_t* __restrict__ token_of_slot, int32_t* err) {
  __shared__ int32_t scan[kPlanThreads];
  const int tid = threadIdx.x;
  const int64_t chunk = (T + kPlanThreads - 1) / kPlanThreads;
  const int64_t t0 = tid * chunk, t1 = min(T, t0 + chunk);
  auto valid_id = [&](int64_t t, int k) -> int {
    const int id = topk_ids[t * K + k];
    if (id < -1 || id >= E) {
      if (atomicCAS(err, 0, 1) == 0) {
        err[1] = static_cast<int32_t>(t);
        err[2] = k;
        err[3] = id;
        __threadfence_system();
      }
      return -1;
    }
    return id;
  };
  int32_t mine = 0;
  for (int64_t t = t0; t < t1; ++t) {
    bool any = false;
    for (int k = 0; k < K; ++k) any |= valid_id(t, k) >= 0;
    mine += any;
  }
  scan[tid] = mine;
  __syncthreads();
  for (int o = 1; o < kPlanThreads; o <<= 1) {  // Hillis-Steele inclusive scan (integers: exact)
    const int32_t v = tid >= o ? scan[tid - o] : 0;
    __syncthreads();
    scan[tid] += v;
    __syncthreads();
  }
  int32_t j = scan[tid] - mine;
  const int32_t n = scan[kPlanThreads - 1];
  for (int64_t t = t0; t < t1; ++t) {
    bool any = false;
    for (int k = 0; k < K; ++k) any |= valid_id(t, k) >= 0;
    if (!any) {
      slot_of_token[t] = -1;
      continue;
    }
    slot_of_token[t] = j;
    token_of_slot[j] = static_cast<int32_t>(t);
    for (int k = 0; k < K; ++k) {
      const int id = valid_id(t, k);
      const int32_t ls = id >= 0 ? choose_slot(off, ranks, slots, id, t) : -1;
      local_ids[int64_t(j) * K + k] = ls;
      weights[int64_t(j) * K + k] = topk_w[t * K + k];
      if (ls >= 0) atomicAdd(&expert_counts[ls], 1);
    }
    ++j;
  }
  // Slots the previous dispatch filled beyond n become invalid again (ids -1, weights 0); everything beyond
  // the old count already is.
  const int32_t old_n = *prev_n;
  for (int64_t s = int64_t(n) + tid; s < old_n && s < C; s += kPlanThreads)
    for (int k = 0; k < K; ++k) {
      local_ids[s * K + k] = -1;
      weights[s * K + k] = 0.f;
    }
  __syncthreads();
  if (tid == 0) {
    counts[0] = n;
    *prev_n = n;
  }
}

__global__ void combine_kernel(ActFormat f, QuantParams p, const bf16_raw* __restrict__ y,
                               const int32_t* __restrict__ slot_of_token, int H, bf16_raw* __restrict__ out) {
  const int64_t t = blockIdx.x;
  const int32_t j = slot_of_token[t];
  bf16_raw* o = out + t * H;
  if (j < 0) {
    for (int i = threadIdx.x; i < H; i += blockDim.x) o[i] = 0;  // +0: nothing to sum
    return;
  }
  const bf16_raw* row = y + int64_t(j) * H;
  if (f == ActFormat::bf16) {
    for (int i = threadIdx.x; i < H; i += blockDim.x)
      o[i] = num::f32_to_bf16(__fadd_rn(0.0f, num::bf16_to_f32(row[i])));
    return;
  }
  // fp8 round trip per block of 128 (the last one partial when H % 128 != 0; lanes past H count 0
  // towards the amax): quantize as the sender would, dequantize as the home rank.
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int b = warp; b < fp8_blocks(H); b += warps) {
    float v[4];
    bool on;
    const dev::Fp8Block bp = dev::fp8_warp_block(row, H, b, lane, p.ue8m0, v, on);
    if (!on) continue;
#pragma unroll
    for (int i = 0; i < 4; ++i)
      o[b * 128 + lane * 4 + i] =
          num::f32_to_bf16(__fadd_rn(0.0f, dev::fp8_dequant(dev::fp8_code(v[i], bp), bp.scale)));
  }
}

}  // namespace

void combine_local(ActFormat f, const QuantParams& p, const bf16_raw* y, const int32_t* slot_of_token, int64_t T,
                   int H, bf16_raw* out, cudaStream_t stream) {
  if (f == ActFormat::fp8 && H % 16 != 0)
    throw UsageError("combine: hidden=" + std::to_string(H) + " is not a multiple of 16, which fp8 combine requires");
  if (T <= 0) return;
  combine_kernel<<<static_cast<unsigned>(T), 256, 0, stream>>>(f, p, y, slot_of_token, H, out);
  EPMOE_CUDA_CHECK_LAUNCH();
}

void local_dispatcher_issues(const MoeConfig& cfg, std::vector<ConfigIssue>& issues) {
  if (cfg.num_ranks != 1)
    issues.push_back({"num_ranks", std::to_string(cfg.num_ranks),
                      "num_ranks=" + std::to_string(cfg.num_ranks) +
                          " but dispatcher local serves exactly one rank; use nccl or nvlink for more"});
  if (cfg.dispatch_format == ActFormat::bf16 && cfg.hidden >= 1 && cfg.hidden % 8 != 0)
    issues.push_back({"hidden", std::to_string(cfg.hidden),
                      "hidden=" + std::to_string(cfg.hidden) +
                          " is not a multiple of 8, which the CUDA bf16 path needs (16-byte rows); use a hidden size "
                          "that is"});
}

LocalCudaDispatcher::LocalCudaDispatcher(const MoeConfig& cfg, int device_index)
    : cfg_(cfg), device_(device_index) {
  validate_or_throw(cfg);
  DeviceGuard g(device_);
  const ExpertPlacement place = cfg.resolved_placement();
  E_loc_ = place.slots_per_rank();
  const int C = cfg.capacity, H = cfg.hidden, K = cfg.top_k;
  const size_t slots = size_t(std::max(C, 1));
  payload_.reserve(slots * payload_bytes(cfg.dispatch_format, H));
  scales_.reserve(std::max<size_t>(1, slots * scale_bytes(cfg.dispatch_format, H)));
  ids_.reserve(slots * K * 4);
  weights_.reserve(slots * K * 4);
  counts_.reserve(4);
  prev_n_.reserve(4);
  expert_counts_.reserve(size_t(std::max(E_loc_, 1)) * 4);
  slot_of_token_.reserve(slots * 4);
  token_of_slot_.reserve(slots * 4);
  const ExpertPlacement::Flat flat = place.flatten();
  place_offsets_.reserve(flat.offsets.size() * 4);
  place_ranks_.reserve(std::max<size_t>(1, flat.ranks.size()) * 4);
  place_slots_.reserve(std::max<size_t>(1, flat.slots.size()) * 4);
  EPMOE_CUDA_CHECK(cudaMemcpy(place_offsets_.get(), flat.offsets.data(), flat.offsets.size() * 4, cudaMemcpyHostToDevice));
  EPMOE_CUDA_CHECK(cudaMemcpy(place_ranks_.get(), flat.ranks.data(), flat.ranks.size() * 4, cudaMemcpyHostToDevice));
  EPMOE_CUDA_CHECK(cudaMemcpy(place_slots_.get(), flat.slots.data(), flat.slots.size() * 4, cudaMemcpyHostToDevice));
  // Every slot starts invalid; later dispatches keep that invariant for slots >= count.
  EPMOE_CUDA_CHECK(cudaMemset(ids_.get(), 0xff, slots * K * 4));
  EPMOE_CUDA_CHECK(cudaMemset(weights_.get(), 0, slots * K * 4));
  EPMOE_CUDA_CHECK(cudaMemset(counts_.get(), 0, 4));
  EPMOE_CUDA_CHECK(cudaMemset(prev_n_.get(), 0, 4));
  EPMOE_CUDA_CHECK(cudaMemset(expert_counts_.get(), 0, size_t(std::max(E_loc_, 1)) * 4));
  EPMOE_CUDA_CHECK(cudaHostAlloc(&err_host_, sizeof(ErrorRecord), cudaHostAllocMapped));
  *err_host_ = ErrorRecord{0, 0, 0, 0};
  EPMOE_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&err_dev_), err_host_, 0));
  // The uploads and memsets above ran on the legacy stream and may still be in flight (a memset of
  // device memory and a pageable upload return early); the caller's stream may be non-blocking.
  EPMOE_CUDA_CHECK(cudaDeviceSynchronize());
}

LocalCudaDispatcher::~LocalCudaDispatcher() {
  if (err_host_) cudaFreeHost(err_host_);
}

void LocalCudaDispatcher::check_errors(bool sync) {
  if (sync) EPMOE_CUDA_CHECK(cudaDeviceSynchronize());
  volatile ErrorRecord* e = err_host_;
  if (e->flag) {
    const ErrorRecord r{e->flag, e->token, e->k, e->id};
    e->flag = 0;
    detail::InputProblem p;
    p.code = detail::input::kBadId;
    p.token = r.token;
    p.k = r.k;
    p.value = r.id;
    throw UsageError(detail::input_message(p, 0, cfg_.capacity, cfg_.num_experts) +
                     " (found on the device by an earlier dispatch, which treated it as -1)");
  }
}

DispatchOutput LocalCudaDispatcher::dispatch(const DispatchInput& in) {
  check_errors(false);
  const int64_t T = in.num_tokens;
  const int C = cfg_.capacity, H = cfg_.hidden, K = cfg_.top_k;
  const detail::InputProblem problem = detail::check_input_shape(T, C, in.hidden, in.topk_ids, in.topk_weights);
  if (!problem.ok())
    throw UsageError(detail::rejected_dispatch({detail::input_message(problem, 0, C, cfg_.num_experts)}));
  DeviceGuard g(device_);
  cudaStream_t st = static_cast<cudaStream_t>(in.stream);
  EPMOE_CUDA_CHECK(cudaMemsetAsync(expert_counts_.get(), 0, size_t(std::max(E_loc_, 1)) * 4, st));
  plan_kernel<<<1, kPlanThreads, 0, st>>>(in.topk_ids, in.topk_weights, T, K, cfg_.num_experts, C,
                                          place_offsets_.get<int32_t>(), place_ranks_.get<int32_t>(),
                                          place_slots_.get<int32_t>(), ids_.get<int32_t>(), weights_.get<float>(),
                                          counts_.get<int32_t>(), expert_counts_.get<int32_t>(),
                                          prev_n_.get<int32_t>(), slot_of_token_.get<int32_t>(),
                                          token_of_slot_.get<int32_t>(), &err_dev_->flag);
  EPMOE_CUDA_CHECK_LAUNCH();
  // Rows are written only for slots < count; the grid covers the T tokens (count <= T).
  quantize_rows_gather(cfg_.dispatch_format, cfg_.quant_params(), in.hidden, token_of_slot_.get<int32_t>(),
                       counts_.get<int32_t>(), T, H, payload_.get<uint8_t>(), scales_.get<uint8_t>(), st);
  last_T_ = T;

  return detail::make_dispatch_output(
      cfg_, DeviceKind::cuda,
      detail::RecvBuffers{payload_.get<uint8_t>(), scales_.get<uint8_t>(), ids_.get<int32_t>(), weights_.get<float>(),
                          counts_.get<int32_t>(), expert_counts_.get<int32_t>()});
}

void LocalCudaDispatcher::combine(const CombineInput& in, bf16_raw* out) {
  // No check_errors here: the flag may come from this call's own dispatch, depending on how far
  // the device got; reporting it at the next dispatch keeps the outcome independent of timing
  // (this call's outputs are written, with the bad ids as -1).
  if (last_T_ < 0) throw UsageError(detail::combine_without_dispatch());
  if (last_T_ > 0 && !in.y) throw UsageError(detail::combine_null_y(last_T_));
  if (last_T_ > 0 && !out) throw UsageError(detail::combine_null_out(last_T_));
  DeviceGuard g(device_);
  combine_local(cfg_.combine_format, cfg_.quant_params(), in.y, slot_of_token_.get<int32_t>(), last_T_, cfg_.hidden,
                out, static_cast<cudaStream_t>(in.stream));
}

}  // namespace epmoe::cuda
