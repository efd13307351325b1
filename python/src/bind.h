// Pieces of the epmoe._C module, one per concept; module.cpp assembles them.
#pragma once
#include <nanobind/nanobind.h>

namespace epmoe::py {

namespace nb = nanobind;

void bind_errors(nb::module_& m);
void bind_config(nb::module_& m);
void bind_layer(nb::module_& m);
void bind_harness(nb::module_& m);

}  // namespace epmoe::py
