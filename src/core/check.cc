#include "untied/core/check.h"

namespace untied {
namespace {
thread_local int t_rank = -1;
}  // namespace

void set_thread_rank(int rank) { t_rank = rank; }
int thread_rank() { return t_rank; }

std::string error_prefix(const char* file, int line) {
  std::string f = file;
  // Print paths relative to the source tree: ".../src/x.cc" -> "src/x.cc".
  // The last of the tree's top folders in the path marks the tree's root.
  size_t best = std::string::npos;
  for (const char* root : {"/src/", "/include/", "/tests/", "/bench/"}) {
    auto pos = f.rfind(root);
    if (pos != std::string::npos && (best == std::string::npos || pos > best)) best = pos;
  }
  if (best != std::string::npos) f = f.substr(best + 1);
  std::string out;
  if (t_rank >= 0) out = "rank " + std::to_string(t_rank) + ": ";
  return out + f + ":" + std::to_string(line) + ": ";
}

void fail(ErrorKind kind, const std::string& msg) { throw Error(kind, msg); }

}  // namespace untied
