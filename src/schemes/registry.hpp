// The list of position schemes: adding one is a file in this folder, a line
// here, its parameters in include/relpos/attention.hpp.
#pragma once

#include <memory>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "alibi.hpp"
#include "deberta.hpp"
#include "kerple.hpp"
#include "kerple_power.hpp"
#include "none.hpp"
#include "rope.hpp"
#include "shaw.hpp"
#include "t5.hpp"
#include "xl.hpp"

namespace relpos {

template <class... Schemes>
struct SchemeList {
  // Calls f(S{}) for every scheme S, in list order.
  template <class F>
  static void for_each(F&& f) {
    (f(Schemes{}), ...);
  }
  // Calls f(S{}) for the scheme S whose id is `id`.
  template <class F>
  static void visit(Scheme id, F&& f) {
    ((id == Schemes::id ? (f(Schemes{}), true) : false) || ...);
  }
};

using AllSchemes =
    SchemeList<NoPositionScheme, ShawScheme, T5Scheme, AlibiScheme, RopeScheme, XLScheme, KerpleScheme,
               KerplePowerScheme, DebertaScheme>;

// Calls f(option) for the model options of every scheme, in list order.
template <class F>
void for_each_model_option(F&& f) {
  AllSchemes::for_each([&](auto scheme) {
    using S = decltype(scheme);
    if constexpr (requires { S::model_options; })
      for (const ModelOption& option : S::model_options) f(option);
  });
}

// Calls f(name, parameter, gradient...) for the learnable tensors of every
// scheme, with the matching member of each PositionGrads given.
template <class Params, class F, class... Grads>
void for_each_scheme_param(Params& pos, F&& f, Grads&... g) {
  AllSchemes::for_each([&](auto scheme) { decltype(scheme)::for_each_param(pos, f, g...); });
}

// Calls f(i, member of pos, members of grads...) for the members that
// tensors[i] (a scheme's model tensors) names.
template <class Params, class F, class... Grads>
void for_each_model_tensor(const std::vector<ModelTensor>& tensors, Params& pos, F&& f, Grads&... grads) {
  for_each_scheme_param(
      pos,
      [&](const char* name, auto&... members) {
        for (std::size_t i = 0; i < tensors.size(); ++i)
          if (std::string_view(name) == tensors[i].name) f(i, members...);
      },
      grads...);
}

// The kinds of relative term a scheme's file may define as a class template
// built from the call (scheme.hpp): Bias<T>, Rotation<T>, KeyEmbedding<T>,
// ValueEmbedding<T>, QueryEmbedding<T>, QueryBias<T>.
template <class S, class T>
using BiasOf = typename S::template Bias<T>;
template <class S, class T>
using RotationOf = typename S::template Rotation<T>;
template <class S, class T>
using KeyEmbeddingOf = typename S::template KeyEmbedding<T>;
template <class S, class T>
using ValueEmbeddingOf = typename S::template ValueEmbedding<T>;
template <class S, class T>
using QueryEmbeddingOf = typename S::template QueryEmbedding<T>;
template <class S, class T>
using QueryBiasOf = typename S::template QueryBias<T>;

// Whether scheme S defines the term Of<S, T>.
template <template <class, class> class Of, class S, class T, class = void>
struct HasTerm : std::false_type {};
template <template <class, class> class Of, class S, class T>
struct HasTerm<Of, S, T, std::void_t<Of<S, T>>> : std::true_type {};

// The call's term Of (a Base) when its scheme defines one; nullptr otherwise.
template <template <class, class> class Of, class Base, class T>
std::unique_ptr<Base> make_scheme_term(const AttentionForward<T>& p) {
  std::unique_ptr<Base> term;
  AllSchemes::visit(p.pos.scheme, [&](auto scheme) {
    using S = decltype(scheme);
    if constexpr (HasTerm<Of, S, T>::value)
      if (Of<S, T>::applies(p)) term = std::make_unique<Of<S, T>>(p);
  });
  return term;
}

// Whether the scheme `id` defines the term Of.
template <template <class, class> class Of, class T>
bool scheme_has(Scheme id) {
  bool has = false;
  AllSchemes::visit(id, [&](auto scheme) { has = HasTerm<Of, decltype(scheme), T>::value; });
  return has;
}

// The call's bias per (head, distance), or its rotation of q and k.
template <class T>
std::unique_ptr<DistanceBias<T>> make_distance_bias(const AttentionForward<T>& p) {
  return make_scheme_term<BiasOf, DistanceBias<T>>(p);
}
template <class T>
std::unique_ptr<PositionRotation<T>> make_rotation(const AttentionForward<T>& p) {
  return make_scheme_term<RotationOf, PositionRotation<T>>(p);
}

template <class T>
std::unique_ptr<DistanceEmbedding<T>> make_key_embedding(const AttentionForward<T>& p) {
  return make_scheme_term<KeyEmbeddingOf, DistanceEmbedding<T>>(p);
}
template <class T>
std::unique_ptr<DistanceEmbedding<T>> make_value_embedding(const AttentionForward<T>& p) {
  return make_scheme_term<ValueEmbeddingOf, DistanceEmbedding<T>>(p);
}
template <class T>
std::unique_ptr<DistanceEmbedding<T>> make_query_embedding(const AttentionForward<T>& p) {
  return make_scheme_term<QueryEmbeddingOf, DistanceEmbedding<T>>(p);
}
template <class T>
std::unique_ptr<QueryBiases<T>> make_query_bias(const AttentionForward<T>& p) {
  return make_scheme_term<QueryBiasOf, QueryBiases<T>>(p);
}

// The sizes of the call's embeddings (EmbeddingSizes), for any element type.
template <class T>
EmbeddingSizes embedding_sizes(const AttentionForward<T>& p) {
  EmbeddingSizes sizes;
  AllSchemes::visit(p.pos.scheme, [&](auto scheme) {
    using S = decltype(scheme);
    if constexpr (HasTerm<KeyEmbeddingOf, S, T>::value || HasTerm<ValueEmbeddingOf, S, T>::value ||
                  HasTerm<QueryEmbeddingOf, S, T>::value)
      sizes = S::embedding_sizes(p);
  });
  return sizes;
}

// Calls f(name, members...) for every scheme's options that are not tensors,
// the member of each of pos... (for_each_option of the schemes that have some).
template <class S>
concept HasOptions = requires(PositionParams<float>& p) { S::for_each_option([](const char*, auto&) {}, p); };

template <class F, class... Params>
void for_each_scheme_option(F&& f, Params&... pos) {
  const auto params = std::forward_as_tuple(pos...);  // a tuple, not the pack: GCC 12 cannot capture a pack here
  AllSchemes::for_each([&](auto scheme) {
    using S = decltype(scheme);
    if constexpr (HasOptions<S>) std::apply([&](auto&... p) { S::for_each_option(f, p...); }, params);
  });
}

// Copies the scheme and every scheme's options that are not tensors from one
// element type's parameters to another's; tensors are not touched.
template <class A, class B>
void copy_scheme_options(const PositionParams<A>& from, PositionParams<B>& to) {
  to.scheme = from.scheme;
  for_each_scheme_option([](const char*, const auto& source, auto& target) { target = source; }, from, to);
}

inline bool scheme_serves(Scheme id, Algorithm a) {
  bool served = false;
  AllSchemes::visit(id, [&](auto scheme) { served = decltype(scheme)::algorithms.contains(a); });
  return served;
}

}  // namespace relpos
