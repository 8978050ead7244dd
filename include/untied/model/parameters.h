// The decoder's parameters as the model sees them: named, typed views of one group at a time
// (llm.c's ParameterTensors), a store that hands groups out, and the model's initialisation.
//
// Groups (model_config.h): 0 the embedding, 1..N the blocks, N+1 the final norm and LM head (the
// final norm alone with tied embeddings). A
// group's tensors come in descriptor order (parameter_descriptors), which the bind_* functions
// turn into named fields once per group, so no code looks a weight up by name or index.
//
// ParameterStore is what the decoder asks for its parameters; the ZeRO-3 sharding behind it is a
// layer above (dist/sharded_params.h), so the model knows nothing of how parameters are spread.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "untied/core/tensor.h"
#include "untied/model/model_config.h"

namespace untied {

// The full tensors of one group, in descriptor order; buffers are freed with the object.
struct ParamGroup {
  int group = -1;
  std::vector<int> ids;              // parameter indices (descriptor order)
  std::vector<TensorBuffer> tensors;
};

// Weights (compute dtype) or gradients (fp32) of each kind of group; shapes as the descriptors.
struct EmbeddingWeights {
  Tensor embed;  // (V, E)
};
struct BlockWeights {
  Tensor attn_norm;             // (E)
  Tensor wq, wk, wv, wo;        // (H*D, E), (G*D, E), (G*D, E), (E, H*D)
  Tensor q_norm = {}, k_norm = {};  // (D) each, qk_norm only (Qwen3)
  Tensor bq = {}, bk = {}, bv = {};  // (H*D), (G*D), (G*D), qkv_bias only (Qwen2)
  Tensor mlp_norm;              // (E)
  Tensor w_gate, w_up, w_down;  // (F, E), (F, E), (E, F); a MoE layer's are empty
  // A MoE layer (moe_layer): the router (X, E) and the experts' weights stacked, (X, Fe, E),
  // (X, Fe, E), (X, E, Fe); empty in a dense layer.
  Tensor router = {}, e_gate = {}, e_up = {}, e_down = {};
  bool moe() const { return router.ndim() > 0; }
};
struct HeadWeights {
  Tensor final_norm;  // (E)
  Tensor lm_head;     // (V, E); empty with tied embeddings (the embedding group's table is the head)
};

// Named views of a group's tensors. REQUIRES: g is the group of that kind (checked: its size).
EmbeddingWeights bind_embedding(const ParamGroup& g);
BlockWeights bind_block(const ModelConfig& m, const ParamGroup& g);
HeadWeights bind_head(const ModelConfig& m, const ParamGroup& g);

// Where the decoder's parameters live. All three calls are collective over the ranks that share
// the store.
class ParameterStore {
 public:
  virtual ~ParameterStore() = default;
  // The full weights of `group`, in the compute dtype.
  virtual ParamGroup gather(int group) = 0;
  // Full-size fp32 gradient buffers for `group`, zeroed: this rank's partial sums go there.
  virtual ParamGroup grad_buffers(int group) = 0;
  // Adds the group's gradients (summed over ranks) into the store and frees `g`.
  virtual void reduce_grads(ParamGroup& g) = 0;
};

// Llama-style initialisation of parameter `index` (descriptor d): weights uniform with std 0.02
// (wo and w_down scaled by 1/sqrt(2 N)), norm weights 1, biases 0. out[k] is element first + k of the
// flattened tensor; counter-based (random.h), so any split of a tensor gets the same values.
void init_parameter(const ModelConfig& m, const ParamDesc& d, int index, uint64_t seed, int64_t first,
                    std::span<float> out);
// init_parameter for every parameter of m (descriptor order), as a store's init takes it:
// values(index, first, out).
std::function<void(int, int64_t, std::span<float>)> parameter_init(const ModelConfig& m, uint64_t seed);

}  // namespace untied
