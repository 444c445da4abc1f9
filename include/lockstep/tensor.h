// lockstep tensors: the element types a tensor may have, described once (name, size, safetensors
// and GGUF names), and the tagged views and owned buffers through which the op seam, traces,
// dumps and devices see a tensor whatever its type. A tensor's bytes are its elements in order,
// little-endian; its digest (traces, docs/disputes.md) is BLAKE2b-256 of those bytes, for every
// dtype alike.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <ranges>
#include <span>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include "lockstep/core.h"

namespace lockstep {

// In the order of Dtypes(), which is also HostTensor's.
enum class Dtype : uint8_t { kF32, kU32, kF64, kI8, kI32, kBF16 };

// A bfloat16 value: its 16 bits, the high half of the binary32 it was narrowed from. Storage
// only (docs/numerics.md): it is widened exactly to binary32 before any arithmetic.
struct BFloat16 {
  uint16_t bits = 0;
  bool operator==(const BFloat16&) const = default;
};

// The bfloat16 nearest to x (docs/numerics.md, "bf16"): round to nearest, ties to even, on x's
// bits; subnormals kept (never flushed), a finite x past the largest bfloat16 to ±inf, ±0 and
// ±inf kept, and every NaN to the canonical 0x7FC0.
constexpr BFloat16 NarrowToBf16(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return {0x7FC0};
  return {static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16)};
}
// Exact: the binary32 whose high half is b and low half zero.
constexpr float WidenBf16(BFloat16 b) { return std::bit_cast<float>(uint32_t{b.bits} << 16); }

struct DtypeInfo {
  Dtype dtype;
  std::string_view name;         // as traces and dumps record it: "f32", "bf16", ...
  int64_t size;                  // bytes per element
  std::string_view safetensors;  // its safetensors dtype: "F32", "BF16", ...
  int gguf_type;                 // its GGUF ggml_type (F32 0, I8 24, ...), -1 where GGUF has none
};
std::span<const DtypeInfo> Dtypes();  // in Dtype order
const DtypeInfo& InfoOf(Dtype dtype);
std::string_view DtypeName(Dtype dtype);
const DtypeInfo* FindDtype(std::string_view name);  // by name; null when no dtype has it

// The dtype of a C++ element type (float, uint32_t, double, int8_t, int32_t, BFloat16).
template <typename T>
struct DtypeOfElement;
template <>
struct DtypeOfElement<float> {
  static constexpr Dtype value = Dtype::kF32;
};
template <>
struct DtypeOfElement<uint32_t> {
  static constexpr Dtype value = Dtype::kU32;
};
template <>
struct DtypeOfElement<double> {
  static constexpr Dtype value = Dtype::kF64;
};
template <>
struct DtypeOfElement<int8_t> {
  static constexpr Dtype value = Dtype::kI8;
};
template <>
struct DtypeOfElement<int32_t> {
  static constexpr Dtype value = Dtype::kI32;
};
template <>
struct DtypeOfElement<BFloat16> {
  static constexpr Dtype value = Dtype::kBF16;
};
template <typename T>
concept Element = requires {
  DtypeOfElement<std::remove_cv_t<T>>::value;
};
template <Element T>
inline constexpr Dtype kDtypeOf = DtypeOfElement<std::remove_cv_t<T>>::value;

namespace detail {
[[noreturn]] void WrongDtype(Dtype have, Dtype want);
}  // namespace detail

// A tensor someone else holds, read-only: its dtype, where it lies and how many elements. Made
// from any contiguous range of elements the caller keeps alive (a span, a vector).
class TensorView {
 public:
  TensorView() = default;
  TensorView(Dtype dtype, const void* data, int64_t elements)
      : dtype_(dtype), data_(data), elements_(elements) {}
  template <std::ranges::contiguous_range R>
  requires std::ranges::borrowed_range<R> && Element<std::ranges::range_value_t<R>> TensorView(
      R&& values)  // NOLINT(google-explicit-constructor): every range is a view
      : dtype_(kDtypeOf<std::ranges::range_value_t<R>>),
        data_(std::ranges::data(values)),
        elements_(static_cast<int64_t>(std::ranges::size(values))) {}

  Dtype dtype() const { return dtype_; }
  int64_t elements() const { return elements_; }
  bool empty() const { return elements_ == 0; }
  const void* data() const { return data_; }
  std::span<const std::byte> bytes() const {
    return {static_cast<const std::byte*>(data_),
            static_cast<size_t>(elements_ * InfoOf(dtype_).size)};
  }
  // The elements as T; an internal error unless T is the view's dtype.
  template <Element T>
  std::span<const T> As() const {
    if (kDtypeOf<T> != dtype_) detail::WrongDtype(dtype_, kDtypeOf<T>);
    return {static_cast<const T*>(data_), static_cast<size_t>(elements_)};
  }

 private:
  Dtype dtype_ = Dtype::kF32;
  const void* data_ = nullptr;
  int64_t elements_ = 0;
};

// The same, writable: made from a range of non-const elements.
class MutableTensorView {
 public:
  MutableTensorView() = default;
  MutableTensorView(Dtype dtype, void* data, int64_t elements)
      : dtype_(dtype), data_(data), elements_(elements) {}
  template <std::ranges::contiguous_range R>
  requires std::ranges::borrowed_range<R> && Element<std::ranges::range_value_t<R>> &&
      (!std::is_const_v<std::remove_pointer_t<decltype(std::ranges::data(std::declval<R&>()))>>)
          MutableTensorView(R&& values)  // NOLINT(google-explicit-constructor)
      : dtype_(kDtypeOf<std::ranges::range_value_t<R>>),
        data_(std::ranges::data(values)),
        elements_(static_cast<int64_t>(std::ranges::size(values))) {}
  operator TensorView() const { return {dtype_, data_, elements_}; }  // NOLINT

  Dtype dtype() const { return dtype_; }
  int64_t elements() const { return elements_; }
  bool empty() const { return elements_ == 0; }
  void* data() const { return data_; }
  std::span<std::byte> bytes() const {
    return {static_cast<std::byte*>(data_), static_cast<size_t>(elements_ * InfoOf(dtype_).size)};
  }
  template <Element T>
  std::span<T> As() const {
    if (kDtypeOf<T> != dtype_) detail::WrongDtype(dtype_, kDtypeOf<T>);
    return {static_cast<T*>(data_), static_cast<size_t>(elements_)};
  }

 private:
  Dtype dtype_ = Dtype::kF32;
  void* data_ = nullptr;
  int64_t elements_ = 0;
};

// A tensor of any dtype, owned: a vector of its elements.
class HostTensor {
 public:
  HostTensor() = default;  // no f32 elements
  template <Element T>
  HostTensor(std::vector<T> values) : values_(std::move(values)) {}  // NOLINT
  // `elements` zeros of `dtype`; a copy of `view`'s elements.
  static HostTensor Zeros(Dtype dtype, int64_t elements);
  static HostTensor Copy(TensorView view);

  Dtype dtype() const { return static_cast<Dtype>(values_.index()); }
  int64_t elements() const {
    return std::visit([](const auto& v) { return static_cast<int64_t>(v.size()); }, values_);
  }
  TensorView view() const {
    return std::visit([](const auto& v) { return TensorView(v); }, values_);
  }
  MutableTensorView view() {
    return std::visit([](auto& v) { return MutableTensorView(v); }, values_);
  }
  // The elements as T; an internal error unless T is the tensor's dtype.
  template <Element T>
  std::vector<T>& As() {
    if (auto* v = std::get_if<std::vector<T>>(&values_)) return *v;
    detail::WrongDtype(dtype(), kDtypeOf<T>);
  }
  template <Element T>
  const std::vector<T>& As() const {
    return const_cast<HostTensor*>(this)->As<T>();
  }
  // Whether `other` has the same dtype and the same bytes (a NaN equals only its own bits).
  bool SameBytes(const HostTensor& other) const;

 private:
  // In Dtype order (checked in src/core/tensor.cc).
  using Values = std::variant<std::vector<float>, std::vector<uint32_t>, std::vector<double>,
                              std::vector<int8_t>, std::vector<int32_t>, std::vector<BFloat16>>;
  friend struct HostTensorCheck;
  Values values_;
};

}  // namespace lockstep
