// libtorch reports failures by throwing (c10::Error, and std::exception
// subclasses from Gloo and the store). This header is the one thin layer where
// the worker turns them into absl::Status: every call into libtorch that can
// fail for reasons outside the program (a peer died, a timeout, a bad file)
// goes through TorchCall or TorchCallOr.
#ifndef TANDEM_WORKER_RUNTIME_TORCH_STATUS_H_
#define TANDEM_WORKER_RUNTIME_TORCH_STATUS_H_

#include <exception>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "c10/util/Exception.h"

namespace tandem {

// The status for the exception being handled: c10::Error without its C++
// backtrace, other exceptions by what().
inline absl::Status StatusFromCurrentException(absl::string_view what) {
  try {
    throw;
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat(what, ": ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(what, ": ", e.what()));
  } catch (...) {
    return absl::InternalError(absl::StrCat(what, ": unknown exception"));
  }
}

// Runs `fn` (returning void or absl::Status) and maps exceptions to Internal
// errors prefixed with `what`.
template <typename Fn>
absl::Status TorchCall(absl::string_view what, Fn&& fn) {
  try {
    if constexpr (std::is_same_v<decltype(fn()), absl::Status>) {
      return std::forward<Fn>(fn)();
    } else {
      std::forward<Fn>(fn)();
      return absl::OkStatus();
    }
  } catch (...) {
    return StatusFromCurrentException(what);
  }
}

// Runs `fn` returning T or absl::StatusOr<T>.
template <typename T, typename Fn>
absl::StatusOr<T> TorchCallOr(absl::string_view what, Fn&& fn) {
  try {
    return std::forward<Fn>(fn)();
  } catch (...) {
    return StatusFromCurrentException(what);
  }
}

}  // namespace tandem

#endif  // TANDEM_WORKER_RUNTIME_TORCH_STATUS_H_
