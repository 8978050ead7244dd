// Status: the result of an operation that can fail for reasons the user can fix
// (a bad flag, a missing or corrupt file, a configuration that cannot work).
//
// A non-ok Status carries a message that says what was wrong and what to change.
// Bugs and broken invariants are not Statuses: they throw untied::Error (check.h).
//
//   Status s = parse_bytes("8G", &budget);
//   if (!s.ok()) { print(s.message()); return 2; }
//
// StatusOr<T> holds either a value or a non-ok Status.
#pragma once

#include <optional>
#include <string>
#include <utility>

#include "untied/core/check.h"

namespace untied {

class Status {
 public:
  enum class Code { kOk, kInvalidArgument, kNotFound, kCorrupt, kIoError, kUnsupported };

  Status() = default;
  static Status ok_status() { return Status(); }
  static Status invalid_argument(std::string msg) { return Status(Code::kInvalidArgument, std::move(msg)); }
  static Status not_found(std::string msg) { return Status(Code::kNotFound, std::move(msg)); }
  static Status corrupt(std::string msg) { return Status(Code::kCorrupt, std::move(msg)); }
  static Status io_error(std::string msg) { return Status(Code::kIoError, std::move(msg)); }
  static Status unsupported(std::string msg) { return Status(Code::kUnsupported, std::move(msg)); }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  // "invalid argument: <message>" / "ok".
  std::string to_string() const;

 private:
  Status(Code code, std::string msg) : code_(code), message_(std::move(msg)) {}
  Code code_ = Code::kOk;
  std::string message_;
};

template <typename T>
class StatusOr {
 public:
  StatusOr(T value) : value_(std::move(value)) {}                    // NOLINT: implicit by design
  StatusOr(Status status) : status_(std::move(status)) {              // NOLINT: implicit by design
    UNTIED_ASSERT(!status_.ok(), "StatusOr built from an ok Status without a value");
  }
  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  const T& value() const& {
    UNTIED_ASSERT(ok(), "value() of a failed StatusOr: ", status_.message());
    return *value_;
  }
  T&& value() && {
    UNTIED_ASSERT(ok(), "value() of a failed StatusOr: ", status_.message());
    return std::move(*value_);
  }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace untied
