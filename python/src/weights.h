// Expert weights as the runner reads them, with what keeps their bytes alive (host matrices made
// here, or the caller's arrays held as Python objects), and host vectors handed to numpy.
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <initializer_list>
#include <vector>

#include "epmoe/quant.h"
#include "epmoe/runner.h"

namespace epmoe::py {

namespace nb = nanobind;

struct Weights {
  ExpertWeights w;
  HostMatrix w13_host, w2_host;
  std::vector<nb::object> keep;
};

// A host vector as a numpy array that owns it.
template <class T>
nb::object numpy_of(std::vector<T>&& v, std::initializer_list<size_t> shape) {
  auto* heap = new std::vector<T>(std::move(v));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::cast(nb::ndarray<nb::numpy, T>(heap->data(), shape, owner));
}

}  // namespace epmoe::py
