// A test helper: runs a callable that must throw untied::Error of a given kind whose message
// contains every given part. Returns an AssertionResult that names what was wrong.
#pragma once

#include <gtest/gtest.h>

#include <initializer_list>
#include <string>
#include <string_view>

#include "untied/core/check.h"

namespace untied::testing {

inline const char* kind_name(ErrorKind k) {
  switch (k) {
    case ErrorKind::kInvalidArgument: return "kInvalidArgument";
    case ErrorKind::kOutOfBudget: return "kOutOfBudget";
    case ErrorKind::kInternal: return "kInternal";
    case ErrorKind::kAborted: return "kAborted";
    case ErrorKind::kIo: return "kIo";
    case ErrorKind::kUnsupported: return "kUnsupported";
  }
  return "?";
}

// "'text'": how messages quote user input. (Built with append: GCC 12 warns falsely on
// "'" + std::string(text) + "'".)
inline std::string quoted(std::string_view text) {
  std::string q = "'";
  q.append(text);
  q += '\'';
  return q;
}

// On success, *message (when given) receives the error's message.
template <typename F>
::testing::AssertionResult throws_error(F&& f, ErrorKind kind,
                                        std::initializer_list<std::string_view> parts,
                                        std::string* message = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    std::string msg = e.what();
    if (e.kind() != kind)
      return ::testing::AssertionFailure() << "threw " << kind_name(e.kind()) << ", expected "
                                           << kind_name(kind) << "; message: " << msg;
    for (std::string_view p : parts)
      if (msg.find(p) == std::string::npos)
        return ::testing::AssertionFailure() << "message lacks \"" << p << "\"; message: " << msg;
    if (message != nullptr) *message = msg;
    return ::testing::AssertionSuccess();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw a non-untied exception: " << e.what();
  }
  return ::testing::AssertionFailure() << "did not throw (expected " << kind_name(kind) << ")";
}

}  // namespace untied::testing
