// C++ errors as Python exceptions carrying the C++ message: UsageError is a ValueError,
// TimeoutError a TimeoutError (with .rank, the first missing peer), BackendError a RuntimeError.
#include <nanobind/nanobind.h>

#include "bind.h"
#include "epmoe/error.h"

namespace epmoe::py {

void bind_errors(nb::module_& m) {
  static nb::object usage = nb::borrow(PyErr_NewExceptionWithDoc(
      "epmoe.UsageError", "Bad argument or configuration; the message names it, its value and the fix.",
      PyExc_ValueError, nullptr));
  static nb::object timeout = nb::borrow(PyErr_NewExceptionWithDoc(
      "epmoe.TimeoutError", "A peer rank did not arrive in time; .rank names the first one missing.",
      PyExc_TimeoutError, nullptr));
  static nb::object backend = nb::borrow(PyErr_NewExceptionWithDoc(
      "epmoe.BackendError", "CUDA or NCCL reported a failure.", PyExc_RuntimeError, nullptr));
  m.attr("UsageError") = usage;
  m.attr("TimeoutError") = timeout;
  m.attr("BackendError") = backend;
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const TimeoutError& e) {
      nb::object exc = timeout(nb::str(e.what()));
      nb::setattr(exc, "rank", nb::int_(e.rank()));
      PyErr_SetObject(timeout.ptr(), exc.ptr());
    } catch (const UsageError& e) {
      PyErr_SetString(usage.ptr(), e.what());
    } catch (const BackendError& e) {
      PyErr_SetString(backend.ptr(), e.what());
    } catch (const Error& e) {
      PyErr_SetString(backend.ptr(), e.what());
    }
  });
}

}  // namespace epmoe::py
