// epmoe._C: the C++ library seen from Python. The Python package (python/epmoe) wraps it with
// keyword-friendly helpers and the optional PyTorch integration.
#include <nanobind/nanobind.h>

#include "bind.h"

NB_MODULE(_C, m) {
  m.doc() = "epmoe: expert-parallel Mixture-of-Experts layers (C++ core)";
  m.attr("__version__") = EPMOE_VERSION;
#if defined(EPMOE_WITH_CUDA)
  m.attr("with_cuda") = true;
#else
  m.attr("with_cuda") = false;
#endif
#if defined(EPMOE_WITH_NCCL)
  m.attr("with_nccl") = true;
#else
  m.attr("with_nccl") = false;
#endif
  epmoe::py::bind_errors(m);
  epmoe::py::bind_config(m);
  epmoe::py::bind_layer(m);
  epmoe::py::bind_harness(m);
}
