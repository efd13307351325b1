// Process-wide tuning of the "nvlink" dispatcher's kernels that is not part of the layer
// configuration (ranks may differ; results are bitwise the same for every value).
#pragma once

namespace epmoe::detail {

// Combine flags released per system-scope fence: 1 (default: one st.release per pushed row) or 4
// (a warp pushes 4 rows, then one fence and 4 relaxed flag stores). An experiment: the default
// stays 1 until a GPU run shows 4 faster and bitwise equal (NvlinkDispatch.BatchedCombineFlags).
// EPMOE_NVL_COMBINE_BATCH=1|4 sets it when the first combine is launched; anything else is a
// UsageError. set_nvlink_combine_batch overrides it (tests, benchmarks).
void set_nvlink_combine_batch(int rows_per_fence);
int nvlink_combine_batch();

}  // namespace epmoe::detail
