// The grid of the nvlink dispatch and combine kernels: Tuning::comm_sms CTAs, or by default
// (comm_sms = 0) half the device's SMs. Every CTA spins on flags, so all must be resident; half the
// GPU leaves the rest to work the caller overlaps on other streams (NCCL collectives above all,
// which a grid over every SM could keep from starting while it waits on a peer). The layer runs
// dispatch, runner and combine one after another, so for it the grid is idle SMs put to use: at
// 4096 tokens per rank on 2xH200, 66 CTAs take the fp8 dispatch from 178 to ~126 us and the bf16
// combine from 244 to ~197 us against 24 (bench/results/2026-12-04-session36-2xh200.md).
#pragma once

#include <algorithm>

namespace epmoe::nvlink {

inline int comm_grid(int comm_sms, int device_sms) { return comm_sms > 0 ? comm_sms : std::max(1, device_sms / 2); }

}  // namespace epmoe::nvlink
