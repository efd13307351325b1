// DLPack tensors (numpy, torch, anything with __dlpack__) -> epmoe TensorViews, checked. bf16 comes
// as a bfloat16 tensor or, for numpy, which has no bfloat16, as uint16 holding the raw bits.
#pragma once
#include <nanobind/ndarray.h>

#include <string>

#include "epmoe/error.h"
#include "epmoe/tensor.h"

namespace epmoe::py {

namespace nb = nanobind;
using Array = nb::ndarray<nb::ro>;

inline DType dtype_of(const Array& a, const char* what) {
  const nb::dlpack::dtype d = a.dtype();
  const auto code = nb::dlpack::dtype_code(d.code);
  if (d.lanes == 1) {
    if (code == nb::dlpack::dtype_code::Float && d.bits == 32) return DType::f32;
    if (code == nb::dlpack::dtype_code::Float && d.bits == 64) return DType::f64;
    if (code == nb::dlpack::dtype_code::Bfloat && d.bits == 16) return DType::bf16;
    if (code == nb::dlpack::dtype_code::UInt && d.bits == 16) return DType::bf16;  // raw bf16 bits
    if (code == nb::dlpack::dtype_code::Int && d.bits == 32) return DType::i32;
    if (code == nb::dlpack::dtype_code::UInt && d.bits == 8) return DType::u8;
    if (code == nb::dlpack::dtype_code::Float && d.bits == 8) return DType::e4m3;
  }
  throw UsageError(std::string(what) + " has a dtype epmoe does not take (DLPack code " + std::to_string(d.code) +
                   ", " + std::to_string(d.bits) + " bits); use float32, bfloat16 (uint16 bits for numpy), int32 or "
                   "uint8");
}

// A view of `a`; UsageError when it is on a device epmoe does not serve or has more than 4 dims.
inline TensorView view_of(const Array& a, const char* what) {
  TensorView t;
  t.data = const_cast<void*>(a.data());
  t.dtype = dtype_of(a, what);
  if (a.ndim() > 4) throw UsageError(std::string(what) + " has " + std::to_string(a.ndim()) + " dimensions; at most 4");
  t.ndim = int(a.ndim());
  for (size_t i = 0; i < a.ndim(); ++i) {
    t.shape[i] = int64_t(a.shape(i));
    t.stride[i] = int64_t(a.stride(i));
  }
  if (a.device_type() == nb::device::cpu::value) {
    t.device = DeviceKind::cpu;
  } else if (a.device_type() == nb::device::cuda::value) {
    t.device = DeviceKind::cuda;
    t.device_index = int(a.device_id());
  } else {
    throw UsageError(std::string(what) + " lives on DLPack device type " + std::to_string(a.device_type()) +
                     "; epmoe takes CPU or CUDA tensors");
  }
  return t;
}

}  // namespace epmoe::py
