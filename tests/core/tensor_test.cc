// The dtype table and the tagged tensor views (include/lockstep/tensor.h).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <set>

#include "lockstep/tensor.h"

namespace lockstep {
namespace {

// Every row is in Dtype order, names and safetensors names are unique, and each size is that of
// the element type HostTensor stores for it.
TEST(Dtypes, OneRowPerDtypeInOrderWithItsElementSize) {
  std::set<std::string_view> names, safetensors;
  for (size_t i = 0; i < Dtypes().size(); ++i) {
    const DtypeInfo& info = Dtypes()[i];
    EXPECT_EQ(static_cast<size_t>(info.dtype), i);
    EXPECT_EQ(&InfoOf(info.dtype), &info);
    EXPECT_EQ(FindDtype(info.name), &info);
    EXPECT_TRUE(names.insert(info.name).second) << info.name;
    EXPECT_TRUE(safetensors.insert(info.safetensors).second) << info.safetensors;
    const HostTensor one = HostTensor::Zeros(info.dtype, 3);
    EXPECT_EQ(one.dtype(), info.dtype);
    EXPECT_EQ(one.elements(), 3);
    EXPECT_EQ(static_cast<int64_t>(one.view().bytes().size()), 3 * info.size) << info.name;
  }
  EXPECT_EQ(FindDtype("f16"), nullptr);
  EXPECT_EQ(FindDtype("F32"), nullptr);  // the trace's names, not safetensors'
  EXPECT_EQ(InfoOf(Dtype::kF32).gguf_type, 0);
  EXPECT_EQ(InfoOf(Dtype::kBF16).gguf_type, 30);
  EXPECT_EQ(InfoOf(Dtype::kU32).gguf_type, -1);
}

TEST(TensorView, CarriesItsDtypeAndRefusesAnotherReading) {
  std::vector<float> f = {1.0f, -0.0f};
  const std::vector<uint32_t> ids = {7, 8, 9};
  const TensorView a = f, b = ids;
  EXPECT_EQ(a.dtype(), Dtype::kF32);
  EXPECT_EQ(b.dtype(), Dtype::kU32);
  EXPECT_EQ(b.elements(), 3);
  EXPECT_EQ(b.As<uint32_t>()[2], 9u);
  EXPECT_THROW(b.As<float>(), InternalError);
  const MutableTensorView m = f;
  m.As<float>()[0] = 2.0f;
  EXPECT_EQ(f[0], 2.0f);
  const TensorView back = m;
  EXPECT_EQ(back.data(), f.data());
  EXPECT_EQ(back.bytes().size(), 8u);
  EXPECT_TRUE(TensorView().empty());
}

TEST(HostTensor, CopiesAndComparesBytesNotValues) {
  const std::vector<float> values = {NAN, -0.0f, 1.5f};
  const HostTensor a(values), b = HostTensor::Copy(TensorView(values));
  EXPECT_TRUE(a.SameBytes(b));  // a NaN equals its own bits
  HostTensor c = b;
  c.As<float>()[1] = 0.0f;  // +0 == -0 as values, not as bytes
  EXPECT_FALSE(a.SameBytes(c));
  const std::vector<uint32_t> words = {std::bit_cast<uint32_t>(values[0]),
                                       std::bit_cast<uint32_t>(values[1]),
                                       std::bit_cast<uint32_t>(values[2])};
  EXPECT_FALSE(a.SameBytes(HostTensor(words)));  // the same bytes in another dtype
  EXPECT_THROW(a.As<double>(), InternalError);
  const HostTensor bf = HostTensor::Zeros(Dtype::kBF16, 2);
  EXPECT_EQ(bf.As<BFloat16>()[1].bits, 0);
}

}  // namespace
}  // namespace lockstep
