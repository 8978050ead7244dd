#include "untied/train/sharded_params.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "untied/core/random.h"
#include "untied/kernels/tensor_ops.h"

namespace untied {
namespace {

const Tensor& find_suffix(const std::vector<int>& ids, const std::vector<TensorBuffer>& full,
                          const std::vector<ParamDesc>& descs, const char* suffix) {
  const std::string s = std::string(".") + suffix;
  for (size_t k = 0; k < ids.size(); ++k) {
    const std::string& name = descs[ids[k]].name;
    if (name == suffix || (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0))
      return full[k].view();
  }
  fail(ErrorKind::kInternal, str_cat("no parameter '", suffix, "' in this group"));
}

}  // namespace

const Tensor& ShardedParams::Gathered::operator[](const char* suffix) const {
  return find_suffix(ids, full, *descs, suffix);
}
const Tensor& ShardedParams::GradBuffers::operator[](const char* suffix) const {
  return find_suffix(ids, full, *descs, suffix);
}

ShardedParams::ShardedParams(Device& dev, Communicator& comm, const ModelConfig& cfg, DType compute)
    : dev_(dev), comm_(comm), cfg_(cfg), compute_(compute), descs_(parameter_descriptors(cfg)) {
  Allocator& a = dev.allocator();
  const int64_t C = comm.size();
  for (const ParamDesc& d : descs_) {
    const int64_t s = (d.shape.numel() + C - 1) / C;
    shard_.push_back(s);
    master_.emplace_back(a, DType::kF32, Shape{s}, Tag::kParameters, d.name + " (master shard)");
    grad_.emplace_back(a, DType::kF32, Shape{s}, Tag::kGradients, d.name + " (grad shard)");
    m_.emplace_back(a, DType::kF32, Shape{s}, Tag::kOptimizer, d.name + " (adam m)");
    v_.emplace_back(a, DType::kF32, Shape{s}, Tag::kOptimizer, d.name + " (adam v)");
    for (auto* b : {&master_.back(), &grad_.back(), &m_.back(), &v_.back()}) dev.fill_zero(b->data(), s * 4);
  }
}

int64_t ShardedParams::owned_elems(int i) const {
  const int64_t n = descs_[i].shape.numel(), start = shard_[i] * comm_.rank();
  return std::max<int64_t>(0, std::min(shard_[i], n - start));
}

void ShardedParams::init(uint64_t seed) {
  if (!dev_.backed()) return;
  const float a = 0.02f * std::sqrt(3.0f);  // uniform(-a, a) has std 0.02
  std::vector<float> host;  // each shard is generated on the host and copied to the device
  for (int i = 0; i < num_params(); ++i) {
    const ParamDesc& d = descs_[i];
    const int64_t start = shard_[i] * comm_.rank(), n = owned_elems(i);
    host.assign(static_cast<size_t>(n), 1.0f);  // norm weights
    if (d.kind != ParamKind::kNorm) {
      float scale = a;
      const std::string& nm = d.name;
      if (nm.ends_with(".wo") || nm.ends_with(".w_down")) scale /= std::sqrt(2.0f * static_cast<float>(cfg_.layers));
      for (int64_t k = 0; k < n; ++k) host[k] = scale * hash_uniform(seed, 1000 + static_cast<uint64_t>(i), start + k);
    }
    dev_.copy(master(i), host.data(), n * 4);
  }
}

void ShardedParams::read_state(int i, float* out) const {
  const int64_t n = shard_[i];
  for (int k = 0; k < 3; ++k) dev_.copy(out + k * n, (k == 0 ? master_ : k == 1 ? m_ : v_)[i].data(), n * 4);
}

void ShardedParams::write_state(int i, const float* in) {
  const int64_t n = shard_[i];
  for (int k = 0; k < 3; ++k) dev_.copy((k == 0 ? master_ : k == 1 ? m_ : v_)[i].data(), in + k * n, n * 4);
}

ShardedParams::Gathered ShardedParams::gather(int group) {
  Gathered g;
  g.descs = &descs_;
  Allocator& alloc = dev_.allocator();
  const int64_t C = comm_.size(), es = dtype_size(compute_);
  for (int i = 0; i < num_params(); ++i) {
    if (descs_[i].group != group) continue;
    const int64_t s = shard_[i];
    Buffer send = alloc.allocate(s * es, Tag::kCommunication, descs_[i].name + " (gather send)");
    TensorBuffer full(alloc, compute_, Shape{C * s}, Tag::kParameters, descs_[i].name + " (gathered)");
    if (dev_.backed()) {
      convert(dev_, send.data(), compute_, master(i), DType::kF32, s);
      comm_.all_gather(send.data(), full.data(), s * es);
    }
    full.reshape_view(descs_[i].shape);  // the buffer is padded to C * s elements
    g.ids.push_back(i);
    g.full.push_back(std::move(full));
  }
  return g;
}

ShardedParams::GradBuffers ShardedParams::grad_buffers(int group) {
  GradBuffers g;
  g.descs = &descs_;
  for (int i = 0; i < num_params(); ++i) {
    if (descs_[i].group != group) continue;
    TensorBuffer full(dev_.allocator(), DType::kF32, Shape{comm_.size() * shard_[i]}, Tag::kGradients,
                      descs_[i].name + " (full grad)");
    dev_.fill_zero(full.data(), comm_.size() * shard_[i] * 4);
    full.reshape_view(descs_[i].shape);
    g.ids.push_back(i);
    g.full.push_back(std::move(full));
  }
  return g;
}

void ShardedParams::reduce_grads(GradBuffers& g) {
  for (size_t k = 0; k < g.ids.size(); ++k) {
    const int i = g.ids[k];
    const int64_t s = shard_[i];
    Buffer recv = dev_.allocator().allocate(s * 4, Tag::kCommunication, descs_[i].name + " (grad shard recv)");
    if (dev_.backed()) {
      comm_.reduce_scatter(g.full[k].data(), recv.data(), s, DType::kF32, ReduceOp::kSum);
      add_into(dev_, grad(i), DType::kF32, recv.data(), DType::kF32, s);
    }
    g.full[k].reset();
  }
  g.full.clear();
  g.ids.clear();
}

void ShardedParams::zero_grads() {
  for (int i = 0; i < num_params(); ++i) dev_.fill_zero(grad(i), shard_[i] * 4);
}

}  // namespace untied
