// Cross-GPU signalling micro-benchmark (not part of the library): what one status round trip of
// the nvlink dispatcher can cost at best. The dispatch's status phase (a system-scope release of a
// small record into the peer's memory, then an acquire spin on the peer's record) measured 7-9 us
// at 128 tokens (bench a2a --phases, runs 22-29), far more than one NVLink round trip should take.
// This measures, on two P2P-enabled GPUs and without NCCL:
//   A. ping-pong of a flag between one thread on each GPU: st.release.sys into the peer's memory,
//      ld.acquire.sys spin on our own (the dispatcher's pattern) and, for reference, relaxed
//      (volatile) stores and loads with no fences;
//   B. the same ping-pong when, before each release, the CTA has just written B bytes into the
//      peer's memory (the release must make them visible first: what the dispatch's status does
//      after the count phase, and what each combine row flag does after its row);
//   C. a grid barrier of G CTAs on one GPU (atomic add + acquire spin, as the dispatch's one grid
//      barrier), per barrier;
//   D. __threadfence_system() alone, with nothing pending and after B bytes of peer stores;
//   E. what G CTAs can move at all (the dispatch runs on 24 SMs and measured SM-bound at 4096
//      tokens): a plain local copy, and the fp8 dispatch's byte pattern without its arithmetic
//      (read 16 bytes, store 8 into our memory and 8 into the peer's), 64 MiB read per figure.
// Usage: cmake -S . -B build -DEPMOE_BUILD_MICRO=ON && cmake --build build --target micro_flag_latency
//        && build/micro_flag_latency [iters]   (or by hand: nvcc -O3 -std=c++17 -arch=sm_90a ...)
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "core/cuda/check.h"  // the library's CUDA check: errors as exceptions naming the call


constexpr uint64_t kSpinLimitNs = 2000000000ull;  // a spin that takes 2 s reports a failure

__device__ __forceinline__ uint64_t now_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ void st_release_sys(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ uint64_t ld_acquire_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_volatile(uint64_t* p, uint64_t v) { *reinterpret_cast<volatile uint64_t*>(p) = v; }
__device__ __forceinline__ uint64_t ld_volatile(const uint64_t* p) { return *reinterpret_cast<const volatile uint64_t*>(p); }

// Waits until *p >= v; false after kSpinLimitNs.
template <bool kAcquire>
__device__ bool spin_until(const uint64_t* p, uint64_t v) {
  const uint64_t t0 = now_ns();
  while ((kAcquire ? ld_acquire_sys(p) : ld_volatile(p)) < v)
    if (now_ns() - t0 > kSpinLimitNs) return false;
  return true;
}

// One CTA per GPU. The initiator (GPU 0) signals i into the peer's flag and waits for i back;
// the responder (GPU 1) waits for i and signals it back. Before each signal the whole CTA stores
// `burst` bytes into the peer's buffer (0: none). out[0] = ns per round trip, out[1] = 1 if a spin
// timed out.
template <bool kAcquire>
__global__ void pingpong(bool initiator, uint64_t* my_flag, uint64_t* peer_flag, uint4* peer_buf, size_t burst,
                         int iters, uint64_t base, uint64_t* out) {
  __shared__ int failed;
  if (threadIdx.x == 0) failed = 0;
  __syncthreads();
  const size_t n16 = burst / 16;
  uint64_t t0 = 0;
  for (int i = 1; i <= iters && !failed; ++i) {
    const uint64_t v = base + uint64_t(i);
    if (!initiator && threadIdx.x == 0 && !spin_until<kAcquire>(my_flag, v)) failed = 1;
    __syncthreads();
    if (failed) break;
    if (i == 2 && initiator) t0 = now_ns();  // the first round trip warms up
    for (size_t k = threadIdx.x; k < n16; k += blockDim.x) peer_buf[k] = make_uint4(uint32_t(v), uint32_t(k), 0, 0);
    __syncthreads();
    if (threadIdx.x == 0) {
      if (kAcquire) st_release_sys(peer_flag, v);
      else st_volatile(peer_flag, v);
      if (initiator && !spin_until<kAcquire>(my_flag, v)) failed = 1;
    }
    __syncthreads();
  }
  if (initiator && threadIdx.x == 0) {
    out[0] = iters > 1 ? (now_ns() - t0) / uint64_t(iters - 1) : 0;
    out[1] = failed;
  }
}

// G CTAs, one barrier per iteration on a monotone counter (target i * G), as the dispatch does.
__global__ void grid_barrier(uint64_t* counter, int iters, uint64_t* out) {
  const int G = gridDim.x;
  uint64_t t0 = 0;
  for (int i = 1; i <= iters; ++i) {
    if (i == 2) t0 = now_ns();
    __syncthreads();
    if (threadIdx.x == 0) {
      asm volatile("red.release.gpu.global.add.u64 [%0], 1;" ::"l"(counter) : "memory");
      uint64_t v;
      do {
        asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(counter) : "memory");
      } while (v < uint64_t(i) * G);
    }
    __syncthreads();
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) out[0] = iters > 1 ? (now_ns() - t0) / uint64_t(iters - 1) : 0;
}

// __threadfence_system() after `burst` bytes of peer stores by the CTA; out[0] = ns per fence
// (thread 0's fence alone, after the CTA's stores were issued).
__global__ void fence_cost(uint4* peer_buf, size_t burst, int iters, uint64_t* out) {
  const size_t n16 = burst / 16;
  uint64_t sum = 0;
  for (int i = 0; i < iters; ++i) {
    for (size_t k = threadIdx.x; k < n16; k += blockDim.x) peer_buf[k] = make_uint4(uint32_t(i), uint32_t(k), 0, 0);
    __syncthreads();
    if (threadIdx.x == 0) {
      const uint64_t t = now_ns();
      __threadfence_system();
      sum += now_ns() - t;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) out[0] = sum / uint64_t(iters);
}

// Each thread takes two 16-byte input chunks per step (two loads in flight per unroll, four steps
// unrolled) and stores one 16-byte word per destination: into `dst_local` always, into `dst_peer`
// too when it is set (then each destination gets half the input bytes, as the fp8 dispatch's
// local and remote copies do). half == false: a plain copy (both chunks stored locally).
__global__ void __launch_bounds__(512) move_pattern(const uint4* __restrict__ src, size_t n16, uint4* dst_local,
                                                    uint4* dst_peer, bool half) {
  const size_t pairs = n16 / 2, stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < pairs; i += 4 * stride) {
    uint4 a[4], b[4];
#pragma unroll
    for (int u = 0; u < 4; ++u)
      if (i + u * stride < pairs) a[u] = src[2 * (i + u * stride)], b[u] = src[2 * (i + u * stride) + 1];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const size_t j = i + u * stride;
      if (j >= pairs) break;
      if (!half) {
        dst_local[2 * j] = a[u];
        dst_local[2 * j + 1] = b[u];
      } else {
        const uint4 w = make_uint4(a[u].x ^ a[u].y, a[u].z ^ a[u].w, b[u].x ^ b[u].y, b[u].z ^ b[u].w);
        dst_local[j] = w;
        if (dst_peer) dst_peer[j] = w;
      }
    }
  }
}

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 2000;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
  if (n < 2) {
    std::printf("flag_latency: needs 2 GPUs, found %d\n", n);
    return 77;
  }
  int can01 = 0, can10 = 0;
  EPMOE_CUDA_CHECK(cudaDeviceCanAccessPeer(&can01, 0, 1));
  EPMOE_CUDA_CHECK(cudaDeviceCanAccessPeer(&can10, 1, 0));
  if (!can01 || !can10) {
    std::printf("flag_latency: GPUs 0 and 1 have no P2P access\n");
    return 77;
  }
  constexpr size_t kBuf = 4u << 20;
  uint64_t* flag[2];
  uint4* buf[2];
  uint64_t* out[2];
  for (int d = 0; d < 2; ++d) {
    EPMOE_CUDA_CHECK(cudaSetDevice(d));
    EPMOE_CUDA_CHECK(cudaDeviceEnablePeerAccess(1 - d, 0));
    EPMOE_CUDA_CHECK(cudaMalloc(&flag[d], 64));
    EPMOE_CUDA_CHECK(cudaMemset(flag[d], 0, 64));
    EPMOE_CUDA_CHECK(cudaMalloc(&buf[d], kBuf));
    EPMOE_CUDA_CHECK(cudaMalloc(&out[d], 64));
    EPMOE_CUDA_CHECK(cudaMemset(out[d], 0, 64));
  }
  cudaDeviceProp prop;
  EPMOE_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("# flag_latency: 2 x %s, %d iterations per figure (the first round trip not timed)\n", prop.name, iters);

  uint64_t base = 0;  // flags only grow, so every run continues from the last value
  auto run_pingpong = [&](bool acquire, size_t burst, int threads) {
    for (int d = 1; d >= 0; --d) {  // responder first, so that it spins before the first signal
      EPMOE_CUDA_CHECK(cudaSetDevice(d));
      const bool init = d == 0;
      if (acquire)
        pingpong<true><<<1, threads>>>(init, flag[d], flag[1 - d], buf[1 - d], burst, iters, base, out[d]);
      else
        pingpong<false><<<1, threads>>>(init, flag[d], flag[1 - d], buf[1 - d], burst, iters, base, out[d]);
      EPMOE_CUDA_CHECK(cudaGetLastError());
    }
    for (int d = 0; d < 2; ++d) {
      EPMOE_CUDA_CHECK(cudaSetDevice(d));
      EPMOE_CUDA_CHECK(cudaDeviceSynchronize());
    }
    base += uint64_t(iters);
    uint64_t h[2];
    EPMOE_CUDA_CHECK(cudaSetDevice(0));
    EPMOE_CUDA_CHECK(cudaMemcpy(h, out[0], sizeof h, cudaMemcpyDeviceToHost));
    std::printf("A/B  %-8s burst %8zu B, %4d threads: %7.2f us per round trip%s\n", acquire ? "acq/rel" : "volatile",
                burst, threads, double(h[0]) / 1e3, h[1] ? "  (A SPIN TIMED OUT)" : "");
  };
  run_pingpong(false, 0, 32);
  run_pingpong(true, 0, 32);
  for (size_t b : {size_t(2048), size_t(16384), size_t(131072), size_t(1) << 20}) run_pingpong(true, b, 512);

  EPMOE_CUDA_CHECK(cudaSetDevice(0));
  for (int G : {1, 8, 24, 64}) {
    EPMOE_CUDA_CHECK(cudaMemset(flag[0], 0, 64));
    grid_barrier<<<G, 512>>>(flag[0], iters, out[0]);
    EPMOE_CUDA_CHECK(cudaGetLastError());
    EPMOE_CUDA_CHECK(cudaDeviceSynchronize());
    uint64_t h;
    EPMOE_CUDA_CHECK(cudaMemcpy(&h, out[0], sizeof h, cudaMemcpyDeviceToHost));
    std::printf("C    grid barrier, %2d CTAs of 512 threads: %7.2f us per barrier\n", G, double(h) / 1e3);
  }
  for (size_t b : {size_t(0), size_t(16384), size_t(131072), size_t(1) << 20}) {
    fence_cost<<<1, 512>>>(buf[1], b, iters / 10 + 1, out[0]);
    EPMOE_CUDA_CHECK(cudaGetLastError());
    EPMOE_CUDA_CHECK(cudaDeviceSynchronize());
    uint64_t h;
    EPMOE_CUDA_CHECK(cudaMemcpy(&h, out[0], sizeof h, cudaMemcpyDeviceToHost));
    std::printf("D    __threadfence_system after %8zu B of peer stores: %7.2f us\n", b, double(h) / 1e3);
  }

  // E. 64 MiB read per call (the fp8 dispatch at 4096 DeepSeek-V3 tokens reads 58.7 MB).
  constexpr size_t kMove = 64u << 20;
  uint4 *src, *dst, *peer_dst;
  EPMOE_CUDA_CHECK(cudaSetDevice(1));
  EPMOE_CUDA_CHECK(cudaMalloc(&peer_dst, kMove / 2));
  EPMOE_CUDA_CHECK(cudaSetDevice(0));
  EPMOE_CUDA_CHECK(cudaMalloc(&src, kMove));
  EPMOE_CUDA_CHECK(cudaMalloc(&dst, kMove));
  EPMOE_CUDA_CHECK(cudaMemset(src, 1, kMove));
  cudaEvent_t e0, e1;
  EPMOE_CUDA_CHECK(cudaEventCreate(&e0));
  EPMOE_CUDA_CHECK(cudaEventCreate(&e1));
  struct Mode {
    const char* name;
    bool half, peer;
  };
  for (const Mode m : {Mode{"copy local", false, false}, Mode{"fp8 pattern, local only", true, false},
                       Mode{"fp8 pattern, local + peer", true, true}}) {
    for (int G : {16, 24, 32, 48, 64, 132}) {
      float best = 1e30f;
      for (int r = 0; r < 6; ++r) {
        EPMOE_CUDA_CHECK(cudaEventRecord(e0));
        move_pattern<<<G, 512>>>(src, kMove / 16, dst, m.peer ? peer_dst : nullptr, m.half);
        EPMOE_CUDA_CHECK(cudaEventRecord(e1));
        EPMOE_CUDA_CHECK(cudaEventSynchronize(e1));
        float ms = 0;
        EPMOE_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        if (r > 0 && ms < best) best = ms;
      }
      const double stored = m.half ? (m.peer ? 1.0 : 0.5) * kMove : double(kMove);
      std::printf("E    %-26s %3d CTAs: %8.1f us, read %6.0f GB/s, read+stored %6.0f GB/s (%5.1f GB/s per CTA)\n",
                  m.name, G, best * 1e3, kMove / (best * 1e6), (kMove + stored) / (best * 1e6),
                  (kMove + stored) / (best * 1e6) / G);
    }
  }
  return 0;
}
