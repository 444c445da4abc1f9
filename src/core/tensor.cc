// The dtype table and the owned tensor (include/lockstep/tensor.h).
#include "lockstep/tensor.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>

namespace lockstep {

namespace {

// GGUF's ggml_type numbers (ggml.h): F32 0, I8 24, I32 26, F64 28, BF16 30.
constexpr std::array<DtypeInfo, 6> kDtypes = {{
    {Dtype::kF32, "f32", 4, "F32", 0},
    {Dtype::kU32, "u32", 4, "U32", -1},
    {Dtype::kF64, "f64", 8, "F64", 28},
    {Dtype::kI8, "i8", 1, "I8", 24},
    {Dtype::kI32, "i32", 4, "I32", 26},
    {Dtype::kBF16, "bf16", 2, "BF16", 30},
}};
constexpr bool TableInOrder() {
  for (size_t i = 0; i < kDtypes.size(); ++i) {
    if (static_cast<size_t>(kDtypes[i].dtype) != i) return false;
  }
  return true;
}
static_assert(TableInOrder(), "kDtypes is in Dtype order");

template <typename Values, size_t... I>
Values ZerosOf(size_t index, size_t n, std::index_sequence<I...>) {
  Values values;
  ((index == I ? (void)values.template emplace<I>(n) : void()), ...);
  return values;
}

}  // namespace

// HostTensor's alternatives are in Dtype order, so that its index is its dtype.
struct HostTensorCheck {
  template <Element T>
  static constexpr bool InPlace() {
    return std::is_same_v<
        std::variant_alternative_t<static_cast<size_t>(kDtypeOf<T>), HostTensor::Values>,
        std::vector<T>>;
  }
  static constexpr size_t kAlternatives = std::variant_size_v<HostTensor::Values>;
};
static_assert(HostTensorCheck::InPlace<float>() && HostTensorCheck::InPlace<uint32_t>() &&
              HostTensorCheck::InPlace<double>() && HostTensorCheck::InPlace<int8_t>() &&
              HostTensorCheck::InPlace<int32_t>() && HostTensorCheck::InPlace<BFloat16>() &&
              HostTensorCheck::kAlternatives == kDtypes.size());

std::span<const DtypeInfo> Dtypes() { return kDtypes; }

const DtypeInfo& InfoOf(Dtype dtype) {
  const auto i = static_cast<size_t>(dtype);
  LOCKSTEP_CHECK(i < kDtypes.size(), "dtype {}", i);
  return kDtypes[i];
}

std::string_view DtypeName(Dtype dtype) { return InfoOf(dtype).name; }

const DtypeInfo* FindDtype(std::string_view name) {
  const auto it = std::ranges::find(kDtypes, name, &DtypeInfo::name);
  return it == kDtypes.end() ? nullptr : &*it;
}

void detail::WrongDtype(Dtype have, Dtype want) {
  LOCKSTEP_INTERNAL("a {} tensor read as {}", DtypeName(have), DtypeName(want));
}

HostTensor HostTensor::Zeros(Dtype dtype, int64_t elements) {
  LOCKSTEP_CHECK(elements >= 0, "{} zeros", elements);
  HostTensor t;
  t.values_ =
      ZerosOf<Values>(static_cast<size_t>(InfoOf(dtype).dtype), static_cast<size_t>(elements),
                      std::make_index_sequence<std::variant_size_v<Values>>());
  return t;
}

HostTensor HostTensor::Copy(TensorView view) {
  HostTensor t = Zeros(view.dtype(), view.elements());
  if (!view.empty()) std::memcpy(t.view().data(), view.data(), view.bytes().size());
  return t;
}

bool HostTensor::SameBytes(const HostTensor& other) const {
  const TensorView a = view(), b = other.view();
  return a.dtype() == b.dtype() && std::ranges::equal(a.bytes(), b.bytes());
}

}  // namespace lockstep
