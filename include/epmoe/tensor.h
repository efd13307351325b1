// Non-owning tensor views. epmoe never takes ownership of caller memory; views say where the data
// is (host or a CUDA device), what it holds and how it is laid out, so that every entry point can
// check its arguments and fail with a message instead of reading the wrong bytes.
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

namespace epmoe {

// Raw bf16 bits. epmoe keeps bf16 as 16-bit integers on the host so that host and device code share
// one type and conversions are explicit (see numeric.h).
using bf16_raw = uint16_t;

enum class DType : uint8_t { f32, f64, bf16, e4m3, u8, i32 };
enum class DeviceKind : uint8_t { cpu, cuda };

size_t dtype_size(DType);
const char* dtype_name(DType);
const char* device_name(DeviceKind);

// Row-major view with explicit strides (in elements). Up to 4 dimensions.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  int ndim = 0;
  std::array<int64_t, 4> shape{};
  std::array<int64_t, 4> stride{};
  DeviceKind device = DeviceKind::cpu;
  int device_index = 0;

  // A contiguous view of `shape`.
  static TensorView of(void* data, DType dtype, std::initializer_list<int64_t> shape,
                       DeviceKind device = DeviceKind::cpu, int device_index = 0);

  int64_t size(int dim) const { return shape[dim]; }
  int64_t numel() const;
  bool is_contiguous() const;
  template <class T>
  T* as() const { return static_cast<T*>(data); }
  std::string describe() const;  // e.g. "bf16[128, 7168] on cuda:0"
};

// Throws UsageError naming `what` unless `t` has this dtype, this shape (-1 = any extent), is
// contiguous and lives on `device` (on cuda with device_index >= 0: on that GPU, unless empty).
// `data` may be null only when numel() == 0.
void check_tensor(const TensorView& t, std::string_view what, DType dtype,
                  std::initializer_list<int64_t> shape, DeviceKind device, int device_index = -1);

}  // namespace epmoe
