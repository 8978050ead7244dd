// .npy files (NumPy format 1.0): float32, C order. Used by `untied attn --dump` and tests.
#pragma once

#include <string>
#include <vector>

#include "untied/core/status.h"

namespace untied {

// Writes data (product of shape elements, float32) to path, atomically (temporary + rename).
Status write_npy(const std::string& path, const std::vector<int64_t>& shape, const float* data);

// Reads a float32 C-order .npy file; shape receives its dimensions.
Status read_npy(const std::string& path, std::vector<int64_t>* shape, std::vector<float>* data);

}  // namespace untied
