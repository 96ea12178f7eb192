// Plain attention: no relative term (absolute embeddings, if any, live in the model).
#pragma once

#include "scheme.hpp"

namespace relpos {

struct NoPositionScheme : NoLearnableTensors {
  static constexpr Scheme id = Scheme::none;
  static constexpr const char* name = "none";
  static constexpr AlgorithmSet algorithms = {Algorithm::reference, Algorithm::gather, Algorithm::fused};

  template <class T>
  static void check(const AttentionForward<T>&) {}
};

template <>
struct SchemeOf<Scheme::none> : std::type_identity<NoPositionScheme> {};

}  // namespace relpos
