// Tensor views and the argument check every entry point relies on.
#include <gtest/gtest.h>

#include <string>

#include "epmoe/error.h"
#include "epmoe/format.h"
#include "epmoe/tensor.h"

namespace {

using namespace epmoe;

std::string check_message(const TensorView& t, std::string_view what, DType d, std::initializer_list<int64_t> shape,
                          DeviceKind dev, int device_index = -1) {
  try {
    check_tensor(t, what, d, shape, dev, device_index);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(CoreTensor, DtypeSizesAndNames) {
  EXPECT_EQ(dtype_size(DType::f32), 4u);
  EXPECT_EQ(dtype_size(DType::f64), 8u);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::e4m3), 1u);
  EXPECT_EQ(dtype_size(DType::u8), 1u);
  EXPECT_EQ(dtype_size(DType::i32), 4u);
  EXPECT_STREQ(dtype_name(DType::bf16), "bf16");
  EXPECT_STREQ(dtype_name(DType::e4m3), "e4m3");
  EXPECT_STREQ(device_name(DeviceKind::cuda), "cuda");
}

TEST(CoreTensor, OfIsContiguousRowMajor) {
  float buf[24];
  TensorView v = TensorView::of(buf, DType::f32, {2, 3, 4});
  EXPECT_EQ(v.ndim, 3);
  EXPECT_EQ(v.numel(), 24);
  EXPECT_EQ(v.stride[0], 12);
  EXPECT_EQ(v.stride[1], 4);
  EXPECT_EQ(v.stride[2], 1);
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_EQ(v.describe(), "f32[2, 3, 4] on cpu");
  v.stride[0] = 24;  // a padded outer dimension
  EXPECT_FALSE(v.is_contiguous());
  TensorView g = TensorView::of(nullptr, DType::bf16, {128, 7168}, DeviceKind::cuda, 3);
  EXPECT_EQ(g.describe(), "bf16[128, 7168] on cuda:3");
  TensorView e = TensorView::of(nullptr, DType::bf16, {0, 7168});
  EXPECT_EQ(e.numel(), 0);
  EXPECT_TRUE(e.is_contiguous());
  EXPECT_THROW(TensorView::of(buf, DType::f32, {1, 2, 3, 4, 5}), UsageError);
  EXPECT_THROW(TensorView::of(buf, DType::f32, {-1}), UsageError);
}

TEST(CoreTensor, CheckTensorMessages) {
  float buf[4 * 7168 / 1024];
  TensorView ok = TensorView::of(buf, DType::bf16, {4, 7168}, DeviceKind::cuda);
  check_tensor(ok, "hidden", DType::bf16, {-1, 7168}, DeviceKind::cuda);  // no throw

  TensorView wrong = TensorView::of(buf, DType::f32, {4, 7168});
  EXPECT_EQ(check_message(wrong, "hidden", DType::bf16, {-1, 7168}, DeviceKind::cuda),
            "hidden: expected bf16[T, 7168] contiguous on cuda, got f32[4, 7168] on cpu");

  TensorView shape = TensorView::of(buf, DType::bf16, {4, 4096}, DeviceKind::cuda);
  EXPECT_EQ(check_message(shape, "hidden", DType::bf16, {-1, 7168}, DeviceKind::cuda),
            "hidden: expected bf16[T, 7168] contiguous on cuda, got bf16[4, 4096] on cuda:0");

  TensorView rank = TensorView::of(buf, DType::i32, {4}, DeviceKind::cpu);
  EXPECT_NE(check_message(rank, "topk_ids", DType::i32, {4, 8}, DeviceKind::cpu).find("expected i32[4, 8]"),
            std::string::npos);

  TensorView strided = ok;
  strided.stride[0] = 8192;
  const std::string m = check_message(strided, "hidden", DType::bf16, {-1, 7168}, DeviceKind::cuda);
  EXPECT_NE(m.find("not contiguous"), std::string::npos) << m;

  TensorView null = TensorView::of(nullptr, DType::bf16, {4, 7168}, DeviceKind::cuda);
  EXPECT_NE(check_message(null, "hidden", DType::bf16, {-1, 7168}, DeviceKind::cuda).find("null"),
            std::string::npos);
  TensorView empty = TensorView::of(nullptr, DType::bf16, {0, 7168}, DeviceKind::cuda);
  check_tensor(empty, "hidden", DType::bf16, {-1, 7168}, DeviceKind::cuda);  // T = 0 with no buffer is fine

  // A device index, when given, must match (an empty tensor may live anywhere).
  TensorView other = TensorView::of(buf, DType::bf16, {4, 7168}, DeviceKind::cuda, 1);
  check_tensor(other, "hidden", DType::bf16, {-1, 7168}, DeviceKind::cuda);     // no index asked: fine
  check_tensor(other, "hidden", DType::bf16, {-1, 7168}, DeviceKind::cuda, 1);  // the same GPU: fine
  EXPECT_EQ(check_message(other, "hidden", DType::bf16, {-1, 7168}, DeviceKind::cuda, 0),
            "hidden is on cuda:1 but this rank's layer works on cuda:0; move it there (torch: .to('cuda:0'))");
  TensorView empty1 = TensorView::of(nullptr, DType::bf16, {0, 7168}, DeviceKind::cuda, 1);
  check_tensor(empty1, "hidden", DType::bf16, {-1, 7168}, DeviceKind::cuda, 0);
}

TEST(CoreFormat, NamesParseAndSizes) {
  EXPECT_STREQ(format_name(ActFormat::nvfp4), "nvfp4");
  EXPECT_STREQ(format_name(WeightFormat::fp8), "fp8");
  EXPECT_EQ(parse_act_format("fp8"), ActFormat::fp8);
  EXPECT_EQ(parse_act_format("NVFP4"), ActFormat::nvfp4);
  EXPECT_EQ(parse_act_format("fp16"), std::nullopt);
  EXPECT_EQ(parse_weight_format("bf16"), WeightFormat::bf16);
  EXPECT_EQ(parse_weight_format(""), std::nullopt);
  EXPECT_EQ(payload_bytes(ActFormat::fp8, 7168), 7168u);
  EXPECT_EQ(scale_bytes(ActFormat::fp8, 7168), 56u * 4);
  EXPECT_EQ(payload_bytes(ActFormat::nvfp4, 7168), 3584u);
  EXPECT_EQ(scale_bytes(ActFormat::nvfp4, 7168), 448u);
}

}  // namespace
