// The list of position schemes: adding one is a file in this folder, a line
// here, its parameters in include/relpos/attention.hpp.
#pragma once

#include <memory>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "alibi.hpp"
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
               KerplePowerScheme>;

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
// built from the call: Bias<T> (a DistanceBias<T>) and Rotation<T> (a
// PositionRotation<T>).
template <class S, class T>
using BiasOf = typename S::template Bias<T>;
template <class S, class T>
using RotationOf = typename S::template Rotation<T>;

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
    if constexpr (HasTerm<Of, S, T>::value) term = std::make_unique<Of<S, T>>(p);
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

inline bool scheme_serves(Scheme id, Algorithm a) {
  bool served = false;
  AllSchemes::visit(id, [&](auto scheme) { served = decltype(scheme)::algorithms.contains(a); });
  return served;
}

}  // namespace relpos
