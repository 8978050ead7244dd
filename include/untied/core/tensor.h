// Tensor: a non-owning, strided view of typed memory. Up to 4 dimensions, 64-bit sizes and
// strides (in elements). TensorBuffer: a Buffer from the allocator plus a contiguous view of it.
//
// Views never allocate. Shapes use the glossary letters in comments, e.g. q (L, H, D).
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "untied/core/allocator.h"
#include "untied/core/dtype.h"

namespace untied {

inline constexpr int kMaxDims = 4;

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  int ndim() const { return ndim_; }
  int64_t operator[](int i) const { return dims_[i]; }
  int64_t& operator[](int i) { return dims_[i]; }
  int64_t numel() const;
  bool operator==(const Shape& o) const;
  std::string to_string() const;  // "(4096, 32, 128)"

 private:
  std::array<int64_t, kMaxDims> dims_{};
  int ndim_ = 0;
};

class Tensor {
 public:
  Tensor() = default;
  // A contiguous (row-major) view. REQUIRES: every dim >= 0.
  Tensor(void* data, DType dtype, Shape shape);
  Tensor(void* data, DType dtype, Shape shape, Shape strides);

  void* data() const { return data_; }
  template <typename T>
  T* as() const { return static_cast<T*>(data_); }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int ndim() const { return shape_.ndim(); }
  int64_t dim(int i) const { return shape_[i]; }
  int64_t stride(int i) const { return strides_[i]; }
  int64_t numel() const { return shape_.numel(); }
  int64_t bytes() const { return numel() * dtype_size(dtype_); }
  bool is_contiguous() const;

  // Elements [begin, end) of dimension 0 (a view; no copy).
  Tensor slice0(int64_t begin, int64_t end) const;
  // The same bytes with another contiguous shape. REQUIRES: contiguous, equal numel.
  Tensor reshape(Shape shape) const;

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  Shape shape_;
  Shape strides_;
};

// Throws Error(kInvalidArgument) naming `what` and both shapes when t's shape differs.
void check_shape(const Tensor& t, const Shape& expected, const char* what);

// Owns a buffer and a contiguous view of it.
class TensorBuffer {
 public:
  TensorBuffer() = default;
  TensorBuffer(Allocator& alloc, DType dtype, Shape shape, Tag tag, std::string_view what);
  const Tensor& view() const { return view_; }
  operator const Tensor&() const { return view_; }  // NOLINT: a buffer is usable as its view
  void* data() const { return view_.data(); }
  template <typename T>
  T* as() const { return view_.as<T>(); }
  void reset() { buffer_.reset(); view_ = Tensor(); }
  // Views the first shape.numel() elements of the buffer with `shape` (a padded buffer seen with
  // its logical shape). REQUIRES: shape.numel() <= the elements allocated.
  void reshape_view(Shape shape);

 private:
  Buffer buffer_;
  Tensor view_;
};

}  // namespace untied
