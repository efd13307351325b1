// The nvlink kernels' grid (src/dispatch/nvlink/grid.h): an explicit comm_sms is taken as given
// (validate() has bounded it by the device), 0 takes half the device's SMs and never less than one.
#include <gtest/gtest.h>

#include "dispatch/nvlink/grid.h"
#include "epmoe/options.h"

namespace epmoe::nvlink {
namespace {

TEST(NvlinkGrid, ExplicitOrHalfTheDevice) {
  EXPECT_EQ(comm_grid(24, 132), 24);
  EXPECT_EQ(comm_grid(132, 132), 132);
  EXPECT_EQ(comm_grid(0, 132), 66);  // H200, H100 SXM
  EXPECT_EQ(comm_grid(0, 78), 39);
  EXPECT_EQ(comm_grid(0, 1), 1);
  EXPECT_EQ(comm_grid(Tuning{}.comm_sms, 148), 74);  // the default is the half
}

}  // namespace
}  // namespace epmoe::nvlink
