// Localising a mismatch: which hash components differ from the reference checkpoint's, and for
// each differing tensor array where it first differs and by how much.
#include <fmt/ranges.h>

#include <algorithm>
#include <bit>
#include <optional>
#include <cmath>
#include <cstdlib>

#include "lockstep/audit.h"

namespace lockstep::audit {
namespace {

// The float's bits mapped to an integer order that follows the float order.
int64_t OrderedBits(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const int64_t magnitude = bits & 0x7fffffffu;
  return (bits & 0x80000000u) != 0 ? -magnitude : magnitude;
}

std::string Shown(float x) {
  return fmt::format("{} (0x{:08x})", x, std::bit_cast<uint32_t>(x));
}

std::vector<int64_t> MultiIndex(int64_t flat, const std::vector<int64_t>& shape) {
  std::vector<int64_t> index(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    index[d] = flat % shape[d];
    flat /= shape[d];
  }
  return index;
}

// Where two arrays of the same size differ: the first element, and the element with the
// largest absolute difference (the one a single corrupted value stands out as, however far a
// divergence has spread since).
struct ArrayDifference {
  int64_t first = -1, largest = -1, count = 0;
  double largest_abs = 0;
};

ArrayDifference CompareArrays(std::span<const float> ours, std::span<const float> theirs) {
  ArrayDifference d;
  for (size_t i = 0; i < ours.size(); ++i) {
    if (std::bit_cast<uint32_t>(ours[i]) == std::bit_cast<uint32_t>(theirs[i])) continue;
    if (d.first < 0) d.first = static_cast<int64_t>(i);
    ++d.count;
    const double abs = std::fabs(static_cast<double>(ours[i]) - static_cast<double>(theirs[i]));
    if (d.largest < 0 || abs > d.largest_abs) {  // NaN never wins: it is reported as first
      d.largest = static_cast<int64_t>(i);
      d.largest_abs = abs;
    }
  }
  return d;
}

std::string DescribeElement(int64_t flat, std::span<const float> ours,
                            std::span<const float> theirs, const std::vector<int64_t>& shape) {
  const float a = ours[static_cast<size_t>(flat)], b = theirs[static_cast<size_t>(flat)];
  return fmt::format("flat index {} [{}]: replayed {}, reference {}, {} ulp", flat,
                     fmt::join(MultiIndex(flat, shape), ", "), Shown(a), Shown(b),
                     UlpDistance(a, b));
}

std::vector<std::string> ScalarDifferences(const StepState& a, const StepState& b) {
  std::vector<std::string> fields;
  auto integer = [&](const char* name, uint64_t x, uint64_t y) {
    if (x != y) fields.push_back(fmt::format("{} replayed {}, reference {}", name, x, y));
  };
  auto real = [&](const char* name, float x, float y) {
    if (std::bit_cast<uint32_t>(x) != std::bit_cast<uint32_t>(y)) {
      fields.push_back(fmt::format("{} replayed {}, reference {}, {} ulp", name, Shown(x), Shown(y),
                                   UlpDistance(x, y)));
    }
  };
  integer("step", a.step, b.step);
  integer("optimizer_step", a.optimizer_step, b.optimizer_step);
  real("lr", a.lr, b.lr);
  real("grad_norm", a.grad_norm, b.grad_norm);
  real("clip_factor", a.clip_factor, b.clip_factor);
  integer("skipped", a.skipped, b.skipped);
  integer("rng_seed", a.rng_seed, b.rng_seed);
  integer("rng_counter", a.rng_counter, b.rng_counter);
  integer("data_cursor", a.data_cursor, b.data_cursor);
  integer("spike.total_skips", a.spike.total_skips, b.spike.total_skips);
  if (a.spike.recent_skips != b.spike.recent_skips) {
    fields.push_back(fmt::format("spike.recent_skips replayed [{}], reference [{}]",
                                 fmt::join(a.spike.recent_skips, ", "),
                                 fmt::join(b.spike.recent_skips, ", ")));
  }
  return fields;
}

int64_t ElementsOf(const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (const int64_t d : shape) count *= d;  // the shape is a verified checkpoint's or the model's
  return count;
}

std::optional<StateArray> ArrayOfName(std::string_view name) {
  if (name == "param") return StateArray::kParam;
  if (name == "m") return StateArray::kM;
  if (name == "v") return StateArray::kV;
  if (name == "grad") return StateArray::kGrad;
  return std::nullopt;
}

}  // namespace

uint64_t UlpDistance(float a, float b) {
  return static_cast<uint64_t>(std::llabs(OrderedBits(a) - OrderedBits(b)));
}

std::vector<std::string> LocaliseMismatch(const StepState& replayed_state,
                                          const StateHash& replayed_hash,
                                          std::span<const TensorShape> replayed_tensors,
                                          const PieceSource& replayed,
                                          const CheckpointIndex& reference,
                                          const StateHash& reference_hash) {
  std::vector<std::string> lines;
  const StepState& ref = reference.state;
  ArrayDifference largest;
  std::string largest_line;
  auto find = [](std::span<const TensorShape> tensors, std::string_view name) {
    const auto it = std::ranges::find(tensors, name, &TensorShape::name);
    return it == tensors.end() ? std::optional<size_t>()
                               : std::optional<size_t>(static_cast<size_t>(it - tensors.begin()));
  };
  for (const std::string& component : DifferingComponents(replayed_hash, reference_hash)) {
    if (component == "prev_hash") {
      lines.push_back(fmt::format(
          "prev_hash differs: replayed {}, reference {}: the states already differed before step "
          "{}",
          ToHex(replayed_state.prev_hash), ToHex(ref.prev_hash), ref.step));
    } else if (component == "scalars") {
      lines.push_back(fmt::format("scalars differ: {}",
                                  fmt::join(ScalarDifferences(replayed_state, ref), "; ")));
    } else if (component == "descriptor") {
      lines.push_back(fmt::format(
          "descriptor differs (config or dataset): replayed {}, reference {}",
          replayed_state.descriptor, ref.descriptor));
    } else if (component == "tokens") {
      lines.push_back(fmt::format(
          "tokens differ: the replay consumed other token windows (tokens_digest replayed {}, "
          "reference {})",
          ToHex(replayed_state.tokens_digest), ToHex(ref.tokens_digest)));
    } else if (component == "layout") {
      lines.push_back("layout differs: the tensor names or shapes are not the reference's");
    } else if (const size_t colon = component.find(':'); colon != std::string::npos) {
      const std::optional<StateArray> array = ArrayOfName(component.substr(0, colon));
      const std::string name = component.substr(colon + 1);
      const std::optional<size_t> ours = find(replayed_tensors, name);
      const std::optional<size_t> theirs = find(reference.tensors, name);
      if (!array || !ours || !theirs) {
        lines.push_back(fmt::format("{} is only in the {}", component,
                                    !ours ? "reference" : "replay"));
        continue;
      }
      const std::vector<int64_t>& shape = replayed_tensors[*ours].shape;
      if (shape != reference.tensors[*theirs].shape) {
        lines.push_back(fmt::format("{}: shape [{}] replayed, [{}] in the reference", component,
                                    fmt::join(shape, ", "),
                                    fmt::join(reference.tensors[*theirs].shape, ", ")));
        continue;
      }
      if (*array == StateArray::kGrad && reference.gradients != Gradients::kFull) {
        lines.push_back(fmt::format(
            "{} differs: digest replayed {}, reference {}; the reference checkpoint keeps only "
            "the gradients' digests (train with --full-gradients to localise gradient elements)",
            component, ToHex(ComponentDigest(replayed_hash, component)),
            ToHex(ComponentDigest(reference_hash, component))));
        continue;
      }
      // One array of each side in RAM at a time.
      std::vector<float> a(static_cast<size_t>(ElementsOf(shape))), b(a.size());
      ReadCheckpointPiece(reference, *theirs, *array, 0, b);
      replayed(*ours, *array, 0, a);
      const std::vector<int64_t>& ours_shape = shape;
      const ArrayDifference d = CompareArrays(a, b);
      if (d.first < 0) {
        lines.push_back(fmt::format("{}: digests differ but the elements are equal", component));
        continue;
      }
      lines.push_back(fmt::format(
          "{} [{}] differs in {} of {} elements: first at {}; largest |difference| {:.3g} at {}",
          component, fmt::join(ours_shape, ", "), d.count, a.size(),
          DescribeElement(d.first, a, b, ours_shape), d.largest_abs,
          DescribeElement(d.largest, a, b, ours_shape)));
      if (d.largest_abs > largest.largest_abs) {
        largest = d;
        largest_line = fmt::format("largest |difference| of all arrays: {:.3g} in {} at {}",
                                   d.largest_abs, component,
                                   DescribeElement(d.largest, a, b, ours_shape));
      }
    } else {
      lines.push_back(fmt::format("{} differs", component));
    }
  }
  if (!largest_line.empty()) lines.push_back(largest_line);
  return lines;
}

}  // namespace lockstep::audit
