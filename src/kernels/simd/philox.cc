// SIMD Philox word stream: Philox4x32-10 (src/core/philox.cc) on one counter per 64-bit lane,
// so that a lane's 32x32 -> 64-bit products come from one MulEven; integer arithmetic, so every
// target gives the reference's words exactly. Words before the first whole counter and after
// the last whole vector of counters come from the reference.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/simd/philox.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>

#include "kernels/philox_impl.h"

HWY_BEFORE_NAMESPACE();
namespace lockstep::rk::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

void PhiloxWords(uint32_t k0, uint32_t k1, uint64_t first, uint32_t* out, int64_t n) {
  const int64_t head = std::min<int64_t>(n, static_cast<int64_t>((4 - first % 4) % 4));
  ref::PhiloxWords(k0, k1, first, out, head);
  int64_t i = head;
  const hn::ScalableTag<uint64_t> d;
  const hn::Repartition<uint32_t, decltype(d)> d32;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto mul0 = hn::BitCast(d32, hn::Set(d, uint64_t{0xD2511F53}));
  const auto mul1 = hn::BitCast(d32, hn::Set(d, uint64_t{0xCD9E8D57}));
  // Lane j holds counter j / 2 of the vector's (j even) or lanes / 2 + j / 2 (j odd), so that
  // interleaving the 128-bit blocks' lower and upper lanes below puts the words in stream order.
  const auto iota = hn::Iota(d, 0);
  const auto odd = hn::Eq(hn::And(iota, hn::Set(d, 1)), hn::Set(d, 1));
  const auto order =
      hn::Add(hn::ShiftRight<1>(iota), hn::IfThenElseZero(odd, hn::Set(d, uint64_t(lanes) / 2)));
  // The round keys, broadcast once.
  hn::Vec<decltype(d)> key0[10], key1[10];
  for (uint32_t round = 0, r0 = k0, r1 = k1; round < 10;
       ++round, r0 += 0x9E3779B9u, r1 += 0xBB67AE85u) {
    key0[round] = hn::Set(d, uint64_t{r0});
    key1[round] = hn::Set(d, uint64_t{r1});
  }
  for (; i + 4 * lanes <= n; i += 4 * lanes) {
    const auto counter = hn::Add(order, hn::Set(d, (first + static_cast<uint64_t>(i)) / 4));
    // Only the low 32 bits of each lane are a word: MulEven reads those alone, and the high bits
    // an XOR leaves there are dropped when the words are stored.
    auto x0 = counter, x1 = hn::ShiftRight<32>(counter);
    auto x2 = hn::Zero(d), x3 = hn::Zero(d);
    for (int round = 0; round < 10; ++round) {
      const auto p0 = hn::MulEven(hn::BitCast(d32, x0), mul0);
      const auto p1 = hn::MulEven(hn::BitCast(d32, x2), mul1);
      x0 = hn::Xor3(hn::ShiftRight<32>(p1), x1, key0[round]);
      x1 = p1;
      x2 = hn::Xor3(hn::ShiftRight<32>(p0), x3, key1[round]);
      x3 = p0;
    }
    // Words 0 and 1, and 2 and 3, of each counter as the two halves of one 64-bit lane.
    const auto w01 = hn::OddEven(hn::BitCast(d32, hn::ShiftLeft<32>(x1)), hn::BitCast(d32, x0));
    const auto w23 = hn::OddEven(hn::BitCast(d32, hn::ShiftLeft<32>(x3)), hn::BitCast(d32, x2));
    hn::StoreU(hn::BitCast(d32, hn::InterleaveLower(d, hn::BitCast(d, w01), hn::BitCast(d, w23))),
               d32, out + i);
    hn::StoreU(hn::BitCast(d32, hn::InterleaveUpper(d, hn::BitCast(d, w01), hn::BitCast(d, w23))),
               d32, out + i + 2 * lanes);
  }
  ref::PhiloxWords(k0, k1, first + static_cast<uint64_t>(i), out + i, n - i);
}

}  // namespace lockstep::rk::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace lockstep::rk::simd {
HWY_EXPORT(PhiloxWords);

void PhiloxWords(uint32_t k0, uint32_t k1, uint64_t first, uint32_t* out, int64_t n) {
  HWY_DYNAMIC_DISPATCH(PhiloxWords)(k0, k1, first, out, n);
}
}  // namespace lockstep::rk::simd
#endif
