#include "untied/train/flops.h"

#include <string>

namespace untied {

TokenFlops flops_per_token(const ModelConfig& m, int64_t seq, Recompute recompute) {
  const double embed = static_cast<double>(m.vocab) * static_cast<double>(m.hidden);
  const double all = static_cast<double>(parameter_count(m));
  const double matmul = all - embed + (m.tied_embeddings ? embed : 0.0);  // the head multiplies either way
  const double head = m.tied_embeddings ? 0.0 : embed;                    // lm_head.weight, when it is its own
  const double final_norm = static_cast<double>(m.hidden);
  const double blocks = all - embed - head - final_norm;
  const double attention = static_cast<double>(m.layers) * static_cast<double>(m.heads * m.head_dim) *
                           static_cast<double>(seq);  // L * (H*D) * S
  TokenFlops f;
  f.model = 6.0 * matmul + 6.0 * attention;
  f.hardware = f.model + 2.0 * blocks + (recompute == Recompute::kFull ? 2.0 * attention : 0.0);
  return f;
}

std::optional<double> known_peak_tflops(std::string_view name, DType dtype) {
  const bool low = dtype == DType::kBF16;
  const auto has = [&](const char* s) { return name.find(s) != std::string_view::npos; };
  if (has("H200") || (has("H100") && !has("PCIe"))) return low ? 989.0 : 494.0;
  if (has("H100")) return low ? 756.0 : 378.0;
  if (has("B200")) return low ? 2250.0 : 1100.0;
  if (has("A100")) return low ? 312.0 : 156.0;
  return std::nullopt;
}

}  // namespace untied
