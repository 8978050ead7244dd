#include "untied/core/tensor.h"

#include "untied/core/checked_math.h"

namespace untied {

Shape::Shape(std::initializer_list<int64_t> dims) {
  UNTIED_CHECK(dims.size() <= kMaxDims, "at most ", kMaxDims, " dims, got ", dims.size());
  for (int64_t d : dims) dims_[ndim_++] = d;
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim_; ++i) {
    const std::optional<int64_t> next = checked_mul(n, dims_[i]);
    if (!next) mul_or_throw(n, dims_[i], "the elements of shape " + to_string());  // (throws)
    n = *next;
  }
  return n;
}

bool Shape::operator==(const Shape& o) const {
  if (ndim_ != o.ndim_) return false;
  for (int i = 0; i < ndim_; ++i)
    if (dims_[i] != o.dims_[i]) return false;
  return true;
}

std::string Shape::to_string() const {
  std::string s = "(";
  for (int i = 0; i < ndim_; ++i) s += (i ? ", " : "") + std::to_string(dims_[i]);
  return s + ")";
}

namespace {
Shape contiguous_strides(const Shape& shape) {
  Shape st = shape;
  int64_t acc = 1;
  for (int i = shape.ndim() - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= shape[i];
  }
  return st;
}
}  // namespace

Tensor::Tensor(void* data, DType dtype, Shape shape)
    : Tensor(data, dtype, shape, contiguous_strides(shape)) {}

Tensor::Tensor(void* data, DType dtype, Shape shape, Shape strides)
    : data_(data), dtype_(dtype), shape_(shape), strides_(strides) {
  UNTIED_CHECK(shape.ndim() == strides.ndim(), "shape ", shape.to_string(), " and strides ",
               strides.to_string(), " differ in rank");
  for (int i = 0; i < shape.ndim(); ++i)
    UNTIED_CHECK(shape[i] >= 0, "negative dimension in shape ", shape.to_string());
}

bool Tensor::is_contiguous() const { return strides_ == contiguous_strides(shape_); }

Tensor Tensor::slice0(int64_t begin, int64_t end) const {
  UNTIED_CHECK(ndim() >= 1 && 0 <= begin && begin <= end && end <= dim(0), "slice [", begin, ", ",
               end, ") out of range for shape ", shape_.to_string());
  Shape s = shape_;
  s[0] = end - begin;
  char* p = static_cast<char*>(data_);
  if (p != nullptr) p += begin * stride(0) * dtype_size(dtype_);
  return Tensor(p, dtype_, s, strides_);
}

Tensor Tensor::reshape(Shape shape) const {
  UNTIED_CHECK(is_contiguous(), "reshape of a non-contiguous view ", shape_.to_string());
  UNTIED_CHECK(shape.numel() == numel(), "reshape ", shape_.to_string(), " to ", shape.to_string(),
               " changes the element count");
  return Tensor(data_, dtype_, shape);
}

void check_shape(const Tensor& t, const Shape& expected, const char* what) {
  UNTIED_CHECK(t.shape() == expected, what, " has shape ", t.shape().to_string(), ", expected ",
               expected.to_string());
}

TensorBuffer::TensorBuffer(Allocator& alloc, DType dtype, Shape shape, Tag tag, std::string_view what) {
  for (int i = 0; i < shape.ndim(); ++i)
    UNTIED_CHECK(shape[i] >= 0, "negative dimension in shape ", shape.to_string(), " for '", what, "'");
  const int64_t n = shape.numel();
  const std::optional<int64_t> bytes = checked_mul(n, dtype_size(dtype));
  if (!bytes) mul_or_throw(n, dtype_size(dtype), "the bytes of '" + std::string(what) + "'");  // (throws)
  buffer_ = alloc.allocate(*bytes, tag, what);
  view_ = Tensor(buffer_.data(), dtype, shape);
}

void TensorBuffer::reshape_view(Shape shape) {
  UNTIED_CHECK(shape.numel() * dtype_size(view_.dtype()) <= buffer_.bytes(), "reshape_view ", shape.to_string(),
               " needs more than the ", buffer_.bytes(), " bytes allocated");
  view_ = Tensor(buffer_.data(), view_.dtype(), shape);
}

}  // namespace untied
