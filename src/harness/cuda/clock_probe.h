// The SM clock the GPU runs at right now, measured rather than queried (no NVML dependency): the
// benches take it right after a point's timed calls, so that a table says whether the point ran at
// the boost clock or under the power cap. On an H200 sustained dense GEMMs reach the 700 W cap
// within seconds and the SM clock falls from ~1980 to ~1500 MHz, so the same large-M point runs up
// to ~10% slower late in a sweep than first (bench/results/2026-12-04-session33-h200.md).
#pragma once
#include <cuda_runtime.h>

namespace epmoe::harness::cuda {

// One CTA spins for N and then 3N of its own clock cycles, each between a pair of events on
// `stream` (after one untimed spin), three times; MHz = 2N cycles over the difference of the least
// times of each length, which cancels the launch and event overheads both share. Takes ~0.8 ms;
// waits for `stream`.
double sm_clock_mhz(cudaStream_t stream);

}  // namespace epmoe::harness::cuda
