#include "untied/dist/sharded_params.h"

#include <vector>

#include "untied/core/check.h"
#include "untied/kernels/tensor_ops.h"

namespace untied {

ShardedParams::ShardedParams(Device& dev, Communicator& comm, std::vector<ParamDesc> descs, DType compute,
                             ShardedState state, bool experts_local)
    : dev_(dev), comm_(comm), compute_(compute), state_(state), descs_(std::move(descs)) {
  Allocator& a = dev.allocator();
  const int64_t C = comm.size();
  for (const ParamDesc& d : descs_) {
    const int64_t s = (d.shape.numel() + C - 1) / C;
    shard_.push_back(s);
    local_.push_back(experts_local && d.kind == ParamKind::kExperts && d.shape[0] % C == 0);
    master_.emplace_back(a, DType::kF32, Shape{s}, Tag::kParameters, d.name + " (master shard)");
    dev.fill_zero(master_.back().data(), s * 4);
    if (state_ == ShardedState::kWeightsOnly) continue;
    grad_.emplace_back(a, DType::kF32, Shape{s}, Tag::kGradients, d.name + " (grad shard)");
    m_.emplace_back(a, DType::kF32, Shape{s}, Tag::kOptimizer, d.name + " (adam m)");
    v_.emplace_back(a, DType::kF32, Shape{s}, Tag::kOptimizer, d.name + " (adam v)");
    for (auto* b : {&grad_.back(), &m_.back(), &v_.back()}) dev.fill_zero(b->data(), s * 4);
  }
}

void ShardedParams::require_training_state(const char* what) const {
  UNTIED_ASSERT(state_ == ShardedState::kTraining, "ShardedParams::", what, " on a weights-only store");
}

int64_t ShardedParams::owned_elems(int i) const {
  const int64_t n = descs_[i].shape.numel(), start = shard_[i] * comm_.rank();
  return std::max<int64_t>(0, std::min(shard_[i], n - start));
}

void ShardedParams::init(const InitFn& values) {
  if (!dev_.backed()) return;
  std::vector<float> host;  // each shard is generated on the host and copied to the device
  for (int i = 0; i < num_params(); ++i) {
    const int64_t n = owned_elems(i);
    host.assign(static_cast<size_t>(n), 0.0f);
    values(i, shard_[i] * comm_.rank(), std::span<float>(host));
    dev_.copy(master(i), host.data(), n * 4);
  }
}

void ShardedParams::read_state(int i, float* out) const {
  require_training_state("read_state");
  const int64_t n = shard_[i];
  for (int k = 0; k < 3; ++k) dev_.copy(out + k * n, (k == 0 ? master_ : k == 1 ? m_ : v_)[i].data(), n * 4);
}

void ShardedParams::read_master(int i, float* out) const { dev_.copy(out, master_[i].data(), shard_[i] * 4); }

void ShardedParams::write_state(int i, const float* in) {
  require_training_state("write_state");
  const int64_t n = shard_[i];
  for (int k = 0; k < 3; ++k) dev_.copy((k == 0 ? master_ : k == 1 ? m_ : v_)[i].data(), in + k * n, n * 4);
}

ParamGroup ShardedParams::gather(int group) {
  ParamGroup g;
  g.group = group;
  Allocator& alloc = dev_.allocator();
  const int64_t C = comm_.size(), es = dtype_size(compute_);
  for (int i = 0; i < num_params(); ++i) {
    if (descs_[i].group != group) continue;
    const int64_t s = shard_[i];
    if (local_[static_cast<size_t>(i)]) {  // this rank's experts, as they are
      Shape own = descs_[i].shape;
      own = Shape{own[0] / C, own[1], own[2]};
      TensorBuffer mine(alloc, compute_, own, Tag::kParameters, descs_[i].name + " (this rank's experts)");
      convert(dev_, mine.data(), compute_, master(i), DType::kF32, s);
      g.ids.push_back(i);
      g.tensors.push_back(std::move(mine));
      continue;
    }
    Buffer send = alloc.allocate(s * es, Tag::kCommunication, descs_[i].name + " (gather send)");
    TensorBuffer full(alloc, compute_, Shape{C * s}, Tag::kParameters, descs_[i].name + " (gathered)");
    if (dev_.backed()) {
      convert(dev_, send.data(), compute_, master(i), DType::kF32, s);
      comm_.all_gather(send.data(), full.data(), s * es);
    }
    full.reshape_view(descs_[i].shape);  // the buffer is padded to C * s elements
    g.ids.push_back(i);
    g.tensors.push_back(std::move(full));
  }
  return g;
}

ParamGroup ShardedParams::grad_buffers(int group) {
  require_training_state("grad_buffers");
  ParamGroup g;
  g.group = group;
  for (int i = 0; i < num_params(); ++i) {
    if (descs_[i].group != group) continue;
    if (local_[static_cast<size_t>(i)]) {
      const Shape& d = descs_[i].shape;
      TensorBuffer mine(dev_.allocator(), DType::kF32, Shape{d[0] / comm_.size(), d[1], d[2]}, Tag::kGradients,
                        descs_[i].name + " (this rank's experts' grad)");
      dev_.fill_zero(mine.data(), shard_[i] * 4);
      g.ids.push_back(i);
      g.tensors.push_back(std::move(mine));
      continue;
    }
    TensorBuffer full(dev_.allocator(), DType::kF32, Shape{comm_.size() * shard_[i]}, Tag::kGradients,
                      descs_[i].name + " (full grad)");
    dev_.fill_zero(full.data(), comm_.size() * shard_[i] * 4);
    full.reshape_view(descs_[i].shape);
    g.ids.push_back(i);
    g.tensors.push_back(std::move(full));
  }
  return g;
}

void ShardedParams::reduce_grads(ParamGroup& g) {
  require_training_state("reduce_grads");
  for (size_t k = 0; k < g.ids.size(); ++k) {
    const int i = g.ids[k];
    const int64_t s = shard_[i];
    if (local_[static_cast<size_t>(i)]) {  // computed whole here: nothing to sum over ranks
      add_into(dev_, grad(i), DType::kF32, g.tensors[k].data(), DType::kF32, s);
      g.tensors[k].reset();
      continue;
    }
    Buffer recv = dev_.allocator().allocate(s * 4, Tag::kCommunication, descs_[i].name + " (grad shard recv)");
    if (dev_.backed()) {
      comm_.reduce_scatter(g.tensors[k].data(), recv.data(), s, DType::kF32, ReduceOp::kSum);
      add_into(dev_, grad(i), DType::kF32, recv.data(), DType::kF32, s);
    }
    g.tensors[k].reset();
  }
  g.tensors.clear();
  g.ids.clear();
}

void ShardedParams::zero_grads() {
  require_training_state("zero_grads");
  for (int i = 0; i < num_params(); ++i) dev_.fill_zero(grad(i), shard_[i] * 4);
}

}  // namespace untied
