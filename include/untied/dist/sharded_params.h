// Parameters, gradients and optimizer state sharded over all ranks (ZeRO-3 / FSDP style): the
// decoder's ParameterStore (model/parameters.h).
//
// Built from a list of parameter descriptors (name, group, shape); every tensor of n elements is
// split into C equal shards
// of s = ceil(n / C) elements (the last padded with zeros); rank r owns elements [r*s, r*s + s).
// A rank keeps, per parameter, its shard of the fp32 master weights (Tag::kParameters), of the
// fp32 gradient (kGradients) and of the two AdamW moments (kOptimizer).
//
// Use per group (one block, or the embedding, or the final norm + LM head):
//   ParamGroup w = params.gather(g);          // all_gather: full weights in the compute dtype
//   ParamGroup dw = params.grad_buffers(g);   // full-size fp32 local gradients, zeroed
//   ... forward/backward with w, writing dw ...
//   params.reduce_grads(dw);                  // reduce_scatter (sum over ranks) into the grad shards (+=)
// and both free their full-size buffers when they go out of scope, so only one group's full
// weights and gradients are live at a time.
//
// Every buffer is device memory; init and the checkpoint accessors go through the device's copies.
//
// Initial values come from a function of (parameter, element range), e.g. the model's
// init_parameter (counter-based: any number of ranks starts from identical weights).
// All methods except the accessors are collective over the communicator.
#pragma once

#include <cstdint>
#include <vector>

#include <functional>
#include <span>

#include "untied/comm/communicator.h"
#include "untied/core/tensor.h"
#include "untied/device/device.h"
#include "untied/model/parameters.h"

namespace untied {

// What a store holds per parameter: the training state (master, gradient, two moments: 16 bytes
// per parameter over the ranks), or the master weights alone (4 bytes: evaluation), where
// grad_buffers, reduce_grads, zero_grads and the state accessors are errors.
enum class ShardedState { kTraining, kWeightsOnly };

class ShardedParams final : public ParameterStore {
 public:
  // Allocates the shards (zeroed). `compute` is the dtype gathered weights are delivered in.
  // experts_local (expert parallelism, moe.h): a MoE layer's stacked experts (ParamKind::kExperts,
  // X a multiple of the ranks) stay with their owners: rank r's shard is exactly its experts
  // [r X / C, (r + 1) X / C), which gather hands out as they are ((X / C, ...), no all_gather),
  // grad_buffers at that size, and reduce_grads adds into the shard without a reduce-scatter (each
  // expert's gradient is computed whole on its owner).
  ShardedParams(Device& dev, Communicator& comm, std::vector<ParamDesc> descs, DType compute,
                ShardedState state = ShardedState::kTraining, bool experts_local = false);

  // values(i, first, out): out[k] = element first + k of parameter i; called for this rank's
  // real (unpadded) elements of each parameter, generated on the host and copied to the device.
  using InitFn = std::function<void(int i, int64_t first, std::span<float> out)>;
  void init(const InitFn& values);

  ParamGroup gather(int group) override;
  ParamGroup grad_buffers(int group) override;
  // Sums each full gradient over ranks into this rank's gradient shard (+=) and frees `g`.
  void reduce_grads(ParamGroup& g) override;
  void zero_grads();

  int num_params() const { return static_cast<int>(descs_.size()); }
  const ParamDesc& desc(int i) const { return descs_[i]; }
  const std::vector<ParamDesc>& descs() const { return descs_; }
  int64_t shard_elems(int i) const { return shard_[i]; }
  // The element of parameter i's full tensor this rank's shard starts at (rank x shard_elems).
  int64_t first_elem(int i) const { return shard_[i] * comm_.rank(); }
  // Elements of parameter i this rank owns that are real (not padding).
  int64_t owned_elems(int i) const;
  // This rank's shard of parameter i as 3 * shard_elems(i) host floats: master, then the two
  // AdamW moments (checkpoints). Copies through the device.
  void read_state(int i, float* out) const;
  // The master copy of this rank's shard of parameter i: shard_elems(i) host floats (the elements
  // past owned_elems(i) are 0). Copies through the device.
  void read_master(int i, float* out) const;
  void write_state(int i, const float* in);
  // Device memory (host memory on the CPU): for the device's kernels.
  float* master(int i) const { return master_[i].as<float>(); }
  float* grad(int i) const { return grad_[i].as<float>(); }
  float* moment1(int i) const { return m_[i].as<float>(); }
  float* moment2(int i) const { return v_[i].as<float>(); }
  DType compute_dtype() const { return compute_; }
  // Whether parameter i stays with its owner (experts_local).
  bool rank_local(int i) const { return local_[static_cast<size_t>(i)]; }

 private:
  Device& dev_;
  Communicator& comm_;
  void require_training_state(const char* what) const;

  DType compute_;
  ShardedState state_;
  std::vector<ParamDesc> descs_;
  std::vector<int64_t> shard_;
  std::vector<bool> local_;
  std::vector<TensorBuffer> master_, grad_, m_, v_;
};

}  // namespace untied
