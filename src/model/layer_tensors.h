// Private to src/model: a transformer layer's parameter tensors in ParameterSpecs order
// (docs/model.md, "Parameters"): ParameterSpecs makes them from this list, and the model finds
// each by its LayerTensor index, so the two cannot disagree.
#pragma once

#include <array>
#include <cstddef>
#include <string_view>

namespace lockstep::model_internal {

enum LayerTensor : size_t { kAttnNorm, kWq, kWk, kWv, kWo, kFfnNorm, kWGateUp, kWDown };
// Each LayerTensor's name within its layer ("layers.<l>." + name), in that order.
inline constexpr std::array<std::string_view, 8> kLayerTensorNames = {
    "attn_norm.weight", "attn.wq.weight", "attn.wk.weight", "attn.wv.weight",
    "attn.wo.weight",   "ffn_norm.weight", "ffn.w_gate_up.weight", "ffn.w_down.weight"};
inline constexpr size_t kTensorsPerLayer = kLayerTensorNames.size();
static_assert(kWDown + 1 == kTensorsPerLayer);

}  // namespace lockstep::model_internal
