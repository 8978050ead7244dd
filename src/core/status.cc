#include "untied/core/status.h"

namespace untied {

std::string Status::to_string() const {
  switch (code_) {
    case Code::kOk: return "ok";
    case Code::kInvalidArgument: return "invalid argument: " + message_;
    case Code::kNotFound: return "not found: " + message_;
    case Code::kCorrupt: return "corrupt: " + message_;
    case Code::kIoError: return "I/O error: " + message_;
    case Code::kUnsupported: return "unsupported: " + message_;
  }
  return message_;
}

}  // namespace untied
