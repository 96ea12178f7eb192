// RoPE (Su et al.): a rotation of q by its absolute position and of k by its;
// the kernels rotate a head's rows once as they load it (head.hpp).
#pragma once

#include <cmath>

#include "checks.hpp"
#include "scheme.hpp"

namespace relpos {

struct RopeScheme : NoLearnableTensors {
  static constexpr Scheme id = Scheme::rope;
  static constexpr const char* name = "rope";
  static constexpr AlgorithmSet algorithms = {Algorithm::reference, Algorithm::gather, Algorithm::fused};

  // The model: base rope_base, half-split, over the whole head dimension.
  template <class T>
  static std::vector<ModelTensor> model(PositionParams<T>& p, const nn::ModelConfig& c) {
    p.rope.base = c.rope_base;
    return {};
  }

  template <class T>
  static void check(const AttentionForward<T>& p) {
    using checks::fail;
    const RopeParams& r = p.pos.rope;
    const int64_t d = p.q.shape[3], rd = r.rotary_dims ? r.rotary_dims : d;
    if (r.rotary_dims < 0 || rd < 2 || rd % 2 != 0 || rd > d)
      fail("rope.rotary_dims: must be even, >= 2 and <= d=" + std::to_string(d) + ", got " + std::to_string(rd) +
           (r.rotary_dims ? "" : " (0 means d)"));
    if (!(std::isfinite(r.base) && r.base > 1.0)) fail("rope.base: must be finite and > 1");
  }
};

}  // namespace relpos
