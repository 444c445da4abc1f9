// Times each op a pass reports to its observer (bench_train_step --profile, bench_generate
// --profile): GEMMs keyed by form and shape ("gemm_xwt 1x4096x768"), with their FLOPs and the
// bytes of their weight operand, other ops by name.
#pragma once

#include <fmt/format.h>

#include <chrono>
#include <map>
#include <string>

#include "lockstep/model.h"

namespace lockstep::bench {

class OpTimer : public OpObserver {
 public:
  // weight_element_bytes: what a GEMM reads per element of its weight (4; 2 for a decoder's
  // weights packed as bf16); an int8 GEMM's is 1.
  explicit OpTimer(double weight_element_bytes = 4) : weight_element_bytes_(weight_element_bytes) {}
  struct Total {
    int64_t calls = 0;
    double seconds = 0, flops = 0, weight_bytes = 0;
  };
  void Context(uint64_t, int64_t) override {}
  void Begin(std::string_view op, int64_t, std::span<const OpArg> args,
             std::span<const OpTensor>) override {
    key_ = std::string(op);
    flops_ = weight_bytes_ = 0;
    if (op.starts_with("gemm_")) {
      double m = 0, n = 0, k = 0;
      for (const OpArg& a : args) {
        if (a.name == "m") m = a.value;
        if (a.name == "n") n = a.value;
        if (a.name == "k") k = a.value;
      }
      key_ += fmt::format(" {}x{}x{}", m, n, k);
      flops_ = 2 * m * n * k;
      weight_bytes_ = (op.starts_with("gemm_i8") ? 1 : weight_element_bytes_) * n * k;
    }
    start_ = std::chrono::steady_clock::now();
  }
  void End(std::span<const OpOutput>) override {
    Total& t = totals_[key_];
    t.calls += 1;
    t.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    t.flops += flops_;
    t.weight_bytes += weight_bytes_;
  }
  const std::map<std::string, Total>& totals() const { return totals_; }

 private:
  double weight_element_bytes_;
  std::string key_;
  double flops_ = 0, weight_bytes_ = 0;
  std::chrono::steady_clock::time_point start_;
  std::map<std::string, Total> totals_;
};

}  // namespace lockstep::bench
