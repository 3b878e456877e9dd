// One error hierarchy for Sinew. Every error says what went wrong, where ([file:line]) and, where it
// can, what the user can do about it.
//
//   Error                     base; never thrown directly by library code
//   ├── InvalidArgument       bad option, bad configuration value, misuse of an API   (exit 2)
//   ├── DataError             missing, corrupt or mis-shaped data                      (exit 3)
//   ├── CheckpointError       unreadable or inconsistent checkpoint                    (exit 4)
//   ├── CommFailure           a peer died or the communicator broke: recoverable by rebuilding the group
//   │   └── Timeout           an operation missed its deadline
//   └── InternalError         a broken invariant inside Sinew (a bug)
#pragma once

#include <fmt/format.h>

#include <version>
#if defined(__cpp_lib_source_location)
#include <source_location>
#endif
#include <stdexcept>
#include <string>
#include <string_view>

namespace sinew {

#if defined(__cpp_lib_source_location)
using SourceLocation = std::source_location;
#else
/// std::source_location where the standard library lacks it (clang 14 with libstdc++ 12, which the
/// fuzzers and clang-tidy use): the same interface over the builtins both compilers have.
class SourceLocation {
 public:
  static constexpr SourceLocation current(const char* file = __builtin_FILE(),
                                          unsigned line = __builtin_LINE()) noexcept {
    SourceLocation l;
    l.file_ = file;
    l.line_ = line;
    return l;
  }
  [[nodiscard]] constexpr const char* file_name() const noexcept { return file_; }
  [[nodiscard]] constexpr unsigned line() const noexcept { return line_; }

 private:
  const char* file_ = "";
  unsigned line_ = 0;
};
#endif

/// Process exit codes, part of the user contract (docs/usage.md).
enum class ExitCode : int {
  kOk = 0,
  kFailure = 1,      ///< unexpected error or unrecovered failure
  kUsage = 2,        ///< unknown or malformed option, bad configuration value
  kData = 3,         ///< data set missing, corrupt or of the wrong shape
  kCheckpoint = 4,   ///< checkpoint missing, corrupt or inconsistent
  kRelaunch = 75,    ///< asks a supervisor to relaunch from the latest checkpoint (restart mode)
  kCommFailure = 5,  ///< communication failure that could not be recovered
  kService = 6,      ///< a teacher service or its registry (etcd) could not be used (distillation)
};

class Error : public std::runtime_error {
 public:
  Error(std::string_view what, const SourceLocation& where);
  /// The message without the [file:line] prefix.
  [[nodiscard]] const std::string& message() const noexcept { return message_; }
  [[nodiscard]] const SourceLocation& where() const noexcept { return where_; }
  [[nodiscard]] virtual ExitCode exit_code() const noexcept { return ExitCode::kFailure; }

 private:
  std::string message_;
  SourceLocation where_;
};

class InvalidArgument : public Error {
 public:
  using Error::Error;
  [[nodiscard]] ExitCode exit_code() const noexcept override { return ExitCode::kUsage; }
};

class DataError : public Error {
 public:
  using Error::Error;
  [[nodiscard]] ExitCode exit_code() const noexcept override { return ExitCode::kData; }
};

class CheckpointError : public Error {
 public:
  using Error::Error;
  [[nodiscard]] ExitCode exit_code() const noexcept override { return ExitCode::kCheckpoint; }
};

class CommFailure : public Error {
 public:
  using Error::Error;
  [[nodiscard]] ExitCode exit_code() const noexcept override { return ExitCode::kCommFailure; }
};

class Timeout : public CommFailure {
 public:
  using CommFailure::CommFailure;
};

/// A teacher service or its registry (etcd) failed: unreachable, refused, too slow, or a bad answer.
/// Distillation's own failure type: it never counts as a rank failure (the MPI group does not recover
/// from it); the student follows --distill-on-missing instead (docs/distillation.md).
class ServiceError : public Error {
 public:
  using Error::Error;
  [[nodiscard]] ExitCode exit_code() const noexcept override { return ExitCode::kService; }
};

/// A failure that this run does not recover from in place (--elastic restart, or no usable ULFM): the
/// process exits with kRelaunch so that a supervisor relaunches from the latest checkpoint.
class RelaunchRequest : public Error {
 public:
  using Error::Error;
  [[nodiscard]] ExitCode exit_code() const noexcept override { return ExitCode::kRelaunch; }
};

class InternalError : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <class E>
[[noreturn]] void raise(const SourceLocation& where, std::string_view msg) {
  throw E(msg, where);
}
}  // namespace detail

}  // namespace sinew

/// Throw an error of type `Type` with a fmt-formatted message and the call site.
#define SINEW_THROW(Type, ...) \
  ::sinew::detail::raise<::sinew::Type>(::sinew::SourceLocation::current(), ::fmt::format(__VA_ARGS__))

/// Check an invariant that only a bug can break; prints the condition.
#define SINEW_ENFORCE(cond, ...)                                                     \
  do {                                                                               \
    if (!(cond)) [[unlikely]]                                                        \
      ::sinew::detail::raise<::sinew::InternalError>(                                \
          ::sinew::SourceLocation::current(),                                        \
          ::fmt::format("check failed: {}: {}", #cond, ::fmt::format(__VA_ARGS__))); \
  } while (false)

/// Check that two values are equal; prints both values (gloo's ENFORCE_EQ).
#define SINEW_ENFORCE_EQ(a, b, ...)                                                          \
  do {                                                                                       \
    const auto& sinew_a_ = (a);                                                              \
    const auto& sinew_b_ = (b);                                                              \
    if (!(sinew_a_ == sinew_b_)) [[unlikely]]                                                \
      ::sinew::detail::raise<::sinew::InternalError>(                                        \
          ::sinew::SourceLocation::current(),                                                \
          ::fmt::format("check failed: {} == {} ({} vs {}): {}", #a, #b, sinew_a_, sinew_b_, \
                        ::fmt::format(__VA_ARGS__)));                                        \
  } while (false)
