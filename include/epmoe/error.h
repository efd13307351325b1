// Errors raised by epmoe. Every usage error names the field, the value and the fix.
#pragma once
#include <stdexcept>
#include <string>

namespace epmoe {

// Base class of everything epmoe throws.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The caller passed something epmoe cannot accept (shape, id, capacity, configuration).
class UsageError : public Error {
 public:
  using Error::Error;
};

// A peer rank did not arrive within the configured timeout. `rank()` names the first one missing.
class TimeoutError : public Error {
 public:
  TimeoutError(const std::string& what, int missing_rank) : Error(what), rank_(missing_rank) {}
  int rank() const { return rank_; }

 private:
  int rank_;
};

// A backend (CUDA, NCCL) reported a failure.
class BackendError : public Error {
 public:
  using Error::Error;
};

}  // namespace epmoe
