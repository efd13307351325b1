// Tensor views: sizes, names and the argument check every entry point uses.
#include "epmoe/tensor.h"

#include <sstream>

#include "epmoe/error.h"

namespace epmoe {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::bf16: return 2;
    case DType::e4m3: return 1;
    case DType::u8: return 1;
    case DType::i32: return 4;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::bf16: return "bf16";
    case DType::e4m3: return "e4m3";
    case DType::u8: return "u8";
    case DType::i32: return "i32";
  }
  return "?";
}

const char* device_name(DeviceKind d) { return d == DeviceKind::cuda ? "cuda" : "cpu"; }

TensorView TensorView::of(void* data, DType dtype, std::initializer_list<int64_t> shape, DeviceKind device,
                          int device_index) {
  if (shape.size() > 4) {
    throw UsageError("TensorView::of: " + std::to_string(shape.size()) +
                     " dimensions given, at most 4 are supported; reshape the tensor");
  }
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.ndim = static_cast<int>(shape.size());
  int i = 0;
  for (int64_t s : shape) {
    if (s < 0) {
      throw UsageError("TensorView::of: extent " + std::to_string(s) + " of dimension " + std::to_string(i) +
                       " is negative; extents must be >= 0");
    }
    v.shape[i++] = s;
  }
  int64_t st = 1;
  for (int d = v.ndim - 1; d >= 0; --d) {
    v.stride[d] = st;
    st *= v.shape[d];
  }
  v.device = device;
  v.device_index = device_index;
  return v;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) n *= shape[d];
  return n;
}

bool TensorView::is_contiguous() const {
  // Extents of 1 (and empty tensors) place no constraint on their stride.
  if (numel() == 0) return true;
  int64_t st = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    if (shape[d] != 1 && stride[d] != st) return false;
    st *= shape[d];
  }
  return true;
}

namespace {

std::string shape_string(DType dtype, const int64_t* shape, int ndim) {
  std::ostringstream os;
  os << dtype_name(dtype) << '[';
  for (int d = 0; d < ndim; ++d) {
    if (d) os << ", ";
    if (shape[d] < 0) os << '*';
    else os << shape[d];
  }
  os << ']';
  return os.str();
}

}  // namespace

std::string TensorView::describe() const {
  std::string s = shape_string(dtype, shape.data(), ndim);
  if (ndim > 0 && !is_contiguous()) {
    s += " strides [";
    for (int d = 0; d < ndim; ++d) s += (d ? ", " : "") + std::to_string(stride[d]);
    s += "]";
  }
  s += " on ";
  s += device_name(device);
  if (device == DeviceKind::cuda) {
    s += ':';
    s += std::to_string(device_index);
  }
  return s;
}

void check_tensor(const TensorView& t, std::string_view what, DType dtype, std::initializer_list<int64_t> shape,
                  DeviceKind device, int device_index) {
  int64_t want[4] = {0, 0, 0, 0};
  const int want_ndim = static_cast<int>(shape.size());
  int i = 0;
  for (int64_t s : shape) {
    if (i < 4) want[i] = s;
    ++i;
  }
  bool ok = t.dtype == dtype && t.ndim == want_ndim && t.device == device && t.is_contiguous();
  for (int d = 0; ok && d < want_ndim; ++d) {
    if (want[d] >= 0 && t.shape[d] != want[d]) ok = false;
  }
  if (ok && t.data == nullptr && t.numel() != 0) ok = false;
  if (ok && device == DeviceKind::cuda && device_index >= 0 && t.device_index != device_index && t.numel() != 0)
    // Kernels of device_index's context would read another GPU's memory.
    throw UsageError(std::string(what) + " is on cuda:" + std::to_string(t.device_index) +
                     " but this rank's layer works on cuda:" + std::to_string(device_index) +
                     "; move it there (torch: .to('cuda:" + std::to_string(device_index) + "'))");
  if (ok) return;

  // Expected with '-1' shown as the symbolic extent T for the first dimension, '*' otherwise, so the
  // message reads like the documentation ("bf16[T, 7168]").
  std::string expected = std::string(dtype_name(dtype)) + "[";
  for (int d = 0; d < want_ndim; ++d) {
    if (d) expected += ", ";
    if (want[d] >= 0) expected += std::to_string(want[d]);
    else expected += d == 0 ? "T" : "*";
  }
  expected += "] contiguous on ";
  expected += device_name(device);
  std::string msg = std::string(what) + ": expected " + expected + ", got " + t.describe();
  if (t.dtype == dtype && t.ndim == want_ndim && t.device == device && !t.is_contiguous()) {
    msg += " (not contiguous; pass a contiguous copy)";
  } else if (t.data == nullptr && t.numel() != 0 && t.dtype == dtype && t.ndim == want_ndim) {
    msg += " with a null data pointer; pass the buffer's address";
  }
  throw UsageError(msg);
}

}  // namespace epmoe
