#include "backends/cuda/cudnn_attention.h"

#include "backends/cuda/attention_select.h"

#if defined(UNTIED_HAVE_CUDNN_FRONTEND) && !defined(UNTIED_EMULATOR)

#define NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
#include <cudnn_frontend.h>
#include <dlfcn.h>

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "backends/cuda/cuda_device.h"
#include "untied/core/check.h"

// The frontend's dynamic loading reads the library handle from here.
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}

namespace untied::cuda {
namespace {

namespace fe = cudnn_frontend;
using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

struct ForwardGraph {
  std::shared_ptr<fe::graph::Graph> graph;
  TensorPtr q, k, v, o, stats;
  int64_t workspace = 0;
};
struct BackwardGraph {
  std::shared_ptr<fe::graph::Graph> graph;
  TensorPtr q, k, v, o, dout, stats, dq, dk, dv;
  int64_t workspace = 0;
};

std::mutex g_mu;  // the caches and handles below
std::unordered_map<CudnnGraphKey, std::shared_ptr<ForwardGraph>, CudnnGraphKeyHash> g_forward;
std::unordered_map<CudnnGraphKey, std::shared_ptr<BackwardGraph>, CudnnGraphKeyHash> g_backward;
std::unordered_map<cudaStream_t, cudnnHandle_t> g_handles;

void check_fe(fe::error_t e, const CudnnGraphKey& key, const char* step) {
  UNTIED_CHECK(e.is_good(), "cuDNN attention (", key.describe(), "): ", step, " failed: ", e.get_message(),
               " (UNTIED_CUDA_ATTENTION=mma runs our kernels)");
}

cudnnHandle_t handle_for(cudaStream_t stream) {
  auto it = g_handles.find(stream);
  if (it != g_handles.end()) return it->second;
  cudnnHandle_t h = nullptr;
  UNTIED_CHECK(fe::detail::create_handle(&h) == CUDNN_STATUS_SUCCESS, "cudnnCreate failed");
  UNTIED_CHECK(fe::detail::set_stream(h, stream) == CUDNN_STATUS_SUCCESS, "cudnnSetStream failed");
  g_handles.emplace(stream, h);
  return h;
}

// Our (seq, heads, D) rows with row stride rs as cuDNN's (1, heads, seq, D).
TensorPtr tensor(fe::graph::Graph& g, const char* name, int64_t heads, int64_t seq, int64_t d, int64_t rs) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_dim({1, heads, seq, d})
                      .set_stride({seq * rs, d, rs, 1})
                      .set_data_type(fe::DataType_t::BFLOAT16));
}

void build(fe::graph::Graph& g, cudnnHandle_t h, const CudnnGraphKey& key, int64_t* workspace) {
  check_fe(g.validate(), key, "validate");
  check_fe(g.build_operation_graph(h), key, "build_operation_graph");
  check_fe(g.create_execution_plans({fe::HeurMode_t::A}), key, "create_execution_plans");
  check_fe(g.check_support(h), key, "check_support");
  check_fe(g.build_plans(h), key, "build_plans");
  check_fe(g.get_workspace_size(*workspace), key, "get_workspace_size");
}

// A graph of bf16 tensors with fp32 intermediates and compute.
std::shared_ptr<fe::graph::Graph> new_graph() {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

// The key's scale and, when causal, the mask (forward and backward attributes alike).
template <typename Attributes>
Attributes& with_scale_and_mask(Attributes& a, const CudnnGraphKey& key) {
  float scale;
  std::memcpy(&scale, &key.scale_bits, 4);
  a.set_attn_scale(scale);
  if (key.causal) a.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT).set_diagonal_band_right_bound(0);
  return a;
}

std::shared_ptr<ForwardGraph> forward_graph(const CudnnGraphKey& key, cudnnHandle_t h) {
  auto it = g_forward.find(key);
  if (it != g_forward.end()) return it->second;
  auto fg = std::make_shared<ForwardGraph>();
  fg->graph = new_graph();
  fe::graph::Graph& g = *fg->graph;
  fg->q = tensor(g, "Q", key.heads, key.seq_q, key.head_dim, key.q_row_stride);
  fg->k = tensor(g, "K", key.kv_heads, key.seq_k, key.head_dim, key.kv_row_stride);
  fg->v = tensor(g, "V", key.kv_heads, key.seq_k, key.head_dim, key.kv_row_stride);
  auto options = fe::graph::SDPA_attributes().set_name("untied_sdpa").set_generate_stats(true);
  auto [o, stats] = g.sdpa(fg->q, fg->k, fg->v, with_scale_and_mask(options, key));
  o->set_output(true)
      .set_dim({1, key.heads, key.seq_q, key.head_dim})
      .set_stride({key.seq_q * key.q_row_stride, key.head_dim, key.q_row_stride, 1});
  stats->set_output(true).set_data_type(fe::DataType_t::FLOAT).set_dim({1, key.heads, key.seq_q, 1})
      .set_stride({key.heads * key.seq_q, key.seq_q, 1, 1});
  fg->o = o;
  fg->stats = stats;
  build(g, h, key, &fg->workspace);
  g_forward.emplace(key, fg);
  return fg;
}

std::shared_ptr<BackwardGraph> backward_graph(const CudnnGraphKey& key, cudnnHandle_t h) {
  auto it = g_backward.find(key);
  if (it != g_backward.end()) return it->second;
  auto bg = std::make_shared<BackwardGraph>();
  bg->graph = new_graph();
  fe::graph::Graph& g = *bg->graph;
  bg->q = tensor(g, "Q", key.heads, key.seq_q, key.head_dim, key.q_row_stride);
  bg->k = tensor(g, "K", key.kv_heads, key.seq_k, key.head_dim, key.kv_row_stride);
  bg->v = tensor(g, "V", key.kv_heads, key.seq_k, key.head_dim, key.kv_row_stride);
  bg->o = tensor(g, "O", key.heads, key.seq_q, key.head_dim, key.q_row_stride);
  bg->dout = tensor(g, "dO", key.heads, key.seq_q, key.head_dim, key.q_row_stride);
  bg->stats = g.tensor(fe::graph::Tensor_attributes()
                           .set_name("Stats")
                           .set_dim({1, key.heads, key.seq_q, 1})
                           .set_stride({key.heads * key.seq_q, key.seq_q, 1, 1})
                           .set_data_type(fe::DataType_t::FLOAT));
  auto options = fe::graph::SDPA_backward_attributes().set_name("untied_sdpa_backward");
  auto [dq, dk, dv] =
      g.sdpa_backward(bg->q, bg->k, bg->v, bg->o, bg->dout, bg->stats, with_scale_and_mask(options, key));
  dq->set_output(true)
      .set_dim({1, key.heads, key.seq_q, key.head_dim})
      .set_stride({key.seq_q * key.q_row_stride, key.head_dim, key.q_row_stride, 1});
  for (auto& t : {dk, dv})
    t->set_output(true)
        .set_dim({1, key.kv_heads, key.seq_k, key.head_dim})
        .set_stride({key.seq_k * key.kv_row_stride, key.head_dim, key.kv_row_stride, 1});
  bg->dq = dq;
  bg->dk = dk;
  bg->dv = dv;
  build(g, h, key, &bg->workspace);
  g_backward.emplace(key, bg);
  return bg;
}

}  // namespace

Status cudnn_attention_ready() {
  static Status ready = [] {
    const std::string soname = "libcudnn.so.9";
    void* h = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
#if defined(UNTIED_CUDA_LIBRARY_DIR)
    if (h == nullptr) h = dlopen((std::string(UNTIED_CUDA_LIBRARY_DIR) + "/" + soname).c_str(), RTLD_NOW | RTLD_LOCAL);
#endif
    if (h == nullptr) {
      const char* why = dlerror();
      return Status::unsupported("cuDNN attention: " + soname + " could not be loaded (" +
                                 (why != nullptr ? why : "no reason given") +
                                 "): install cuDNN 9 or add its directory to LD_LIBRARY_PATH; our kernels run");
    }
    cudnn_frontend::cudnn_dlhandle = h;
    return Status::ok_status();
  }();
  return ready;
}

void cudnn_attention_forward(Device& dev, const AttentionForwardCall& c) {
  CudaDevice& cd = static_cast<CudaDevice&>(dev);
  const CudnnGraphKey key = cudnn_graph_key(c.s, false, cd.index());
  std::shared_ptr<ForwardGraph> fg;
  cudnnHandle_t h;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    h = handle_for(cd.stream());
    fg = forward_graph(key, h);
  }
  Buffer ws;
  if (fg->workspace > 0) ws = dev.allocator().allocate(fg->workspace, Tag::kAttnWorkspace, "cuDNN attention workspace");
  std::unordered_map<TensorPtr, void*> pack = {{fg->q, const_cast<void*>(c.t.q)}, {fg->k, const_cast<void*>(c.t.k)},
                                               {fg->v, const_cast<void*>(c.t.v)}, {fg->o, c.t.out},
                                               {fg->stats, c.t.lse}};
  check_fe(fg->graph->execute(h, pack, ws.data()), key, "execute");
}

void cudnn_attention_backward(Device& dev, const AttentionBackwardCall& c) {
  CudaDevice& cd = static_cast<CudaDevice&>(dev);
  const CudnnGraphKey key = cudnn_graph_key(c.s, true, cd.index());
  std::shared_ptr<BackwardGraph> bg;
  cudnnHandle_t h;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    h = handle_for(cd.stream());
    bg = backward_graph(key, h);
  }
  Buffer ws;
  if (bg->workspace > 0) ws = dev.allocator().allocate(bg->workspace, Tag::kAttnWorkspace, "cuDNN attention workspace");
  std::unordered_map<TensorPtr, void*> pack = {
      {bg->q, const_cast<void*>(c.t.q)},   {bg->k, const_cast<void*>(c.t.k)},    {bg->v, const_cast<void*>(c.t.v)},
      {bg->o, const_cast<void*>(c.t.out)}, {bg->dout, const_cast<void*>(c.t.dout)},
      {bg->stats, const_cast<float*>(c.t.lse)}, {bg->dq, c.t.dq}, {bg->dk, c.t.dk}, {bg->dv, c.t.dv}};
  check_fe(bg->graph->execute(h, pack, ws.data()), key, "execute");
}

}  // namespace untied::cuda

#else  // a build without the cuDNN frontend headers (scripts/setup.sh fetches them)

#include "untied/core/check.h"

namespace untied::cuda {

Status cudnn_attention_ready() {
#if defined(UNTIED_EMULATOR)
  return Status::unsupported("cuDNN attention: the CUDA emulator cannot run cuDNN; our kernels run");
#else
  return Status::unsupported("cuDNN attention: this build has no cuDNN frontend headers (scripts/setup.sh fetches "
                             "them where a CUDA toolkit is installed; then rebuild); our kernels run");
#endif
}
void cudnn_attention_forward(Device&, const AttentionForwardCall&) { UNTIED_CHECK(false, "cuDNN attention is not built"); }
void cudnn_attention_backward(Device&, const AttentionBackwardCall&) { UNTIED_CHECK(false, "cuDNN attention is not built"); }

}  // namespace untied::cuda

#endif
