// kdm::Status and kdm::StatusOr<T>: errors as values across every kdm API.
//
// A Status is a code (numerically identical to gRPC's and abseil's codes, so a
// Status converts to a grpc::Status without a table) plus a human-readable
// message that names what was wrong. No exception crosses a kdm API: adapters
// around throwing libraries (nlohmann-json, yaml-cpp, CLI11) catch and return a
// Status instead.
//
// Thread-safety: values; distinct objects may be used from distinct threads.
//
// Example:
//   kdm::StatusOr<Topology> t = ParseTopology(text);
//   if (!t.ok()) return t.status();
//   Use(*t);
#ifndef KDM_BASE_STATUS_H_
#define KDM_BASE_STATUS_H_

#include <cassert>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>

namespace kdm {

// Same numbers as grpc::StatusCode and absl::StatusCode.
enum class StatusCode : int {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
  kUnauthenticated = 16,
};

// The upper-case name of a code, e.g. "INVALID_ARGUMENT".
std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  // OK.
  Status() = default;
  // REQUIRES: code != kOk, or message is empty.
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "OK" or "<CODE_NAME>: <message>".
  std::string ToString() const;

  // Returns a copy whose message is "<prefix>: <message>" (OK stays OK).
  Status WithPrefix(std::string_view prefix) const;

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status OkStatus() { return Status(); }
inline Status InvalidArgumentError(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
inline Status NotFoundError(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status AlreadyExistsError(std::string m) {
  return {StatusCode::kAlreadyExists, std::move(m)};
}
inline Status FailedPreconditionError(std::string m) {
  return {StatusCode::kFailedPrecondition, std::move(m)};
}
inline Status ResourceExhaustedError(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}
inline Status UnavailableError(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status DeadlineExceededError(std::string m) {
  return {StatusCode::kDeadlineExceeded, std::move(m)};
}
inline Status InternalError(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status UnimplementedError(std::string m) {
  return {StatusCode::kUnimplemented, std::move(m)};
}
inline Status DataLossError(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status PermissionDeniedError(std::string m) {
  return {StatusCode::kPermissionDenied, std::move(m)};
}
inline Status OutOfRangeError(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
inline Status CancelledError(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }
inline Status AbortedError(std::string m) { return {StatusCode::kAborted, std::move(m)}; }

std::ostream& operator<<(std::ostream& os, const Status& s);

// Either a value or a non-OK Status.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  // REQUIRES: !status.ok() (an OK status without a value is a bug; it is
  // turned into an INTERNAL error rather than crashing).
  StatusOr(Status status) : status_(std::move(status)) {  // NOLINT: implicit
    if (status_.ok()) status_ = InternalError("StatusOr built from OK status without a value");
  }
  StatusOr(const T& value) : value_(value) {}        // NOLINT: implicit
  StatusOr(T&& value) : value_(std::move(value)) {}  // NOLINT: implicit

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }

  // REQUIRES: ok().
  const T& value() const& {
    assert(ok());
    return *value_;
  }
  T& value() & {
    assert(ok());
    return *value_;
  }
  T&& value() && {
    assert(ok());
    return std::move(*value_);
  }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace kdm

// Returns from the enclosing function when `expr` (a Status) is not OK.
#define KDM_RETURN_IF_ERROR(expr)              \
  do {                                         \
    ::kdm::Status kdm_status_ = (expr);        \
    if (!kdm_status_.ok()) return kdm_status_; \
  } while (0)

#define KDM_STATUS_CONCAT_INNER_(a, b) a##b
#define KDM_STATUS_CONCAT_(a, b) KDM_STATUS_CONCAT_INNER_(a, b)

// `KDM_ASSIGN_OR_RETURN(auto x, MakeX());` declares x from a StatusOr, or
// returns its status from the enclosing function.
#define KDM_ASSIGN_OR_RETURN(lhs, expr)                          \
  auto KDM_STATUS_CONCAT_(kdm_statusor_, __LINE__) = (expr);     \
  if (!KDM_STATUS_CONCAT_(kdm_statusor_, __LINE__).ok())         \
    return KDM_STATUS_CONCAT_(kdm_statusor_, __LINE__).status(); \
  lhs = std::move(KDM_STATUS_CONCAT_(kdm_statusor_, __LINE__)).value()

#endif  // KDM_BASE_STATUS_H_
