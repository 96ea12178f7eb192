// The list of position schemes: adding one is a file in this folder, a line
// here, its parameters in include/relpos/attention.hpp.
#pragma once

#include <memory>
#include <type_traits>
#include <utility>

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

// Whether scheme S's relative term is a bias per distance: it has a class
// template Bias<T> deriving from DistanceBias<T>.
template <class S, class T, class = void>
struct HasDistanceBias : std::false_type {};
template <class S, class T>
struct HasDistanceBias<S, T, std::void_t<typename S::template Bias<T>>> : std::true_type {};

// The call's bias per (head, distance) when its scheme's relative term is
// one; nullptr otherwise.
template <class T>
std::unique_ptr<DistanceBias<T>> make_distance_bias(const AttentionForward<T>& p) {
  std::unique_ptr<DistanceBias<T>> bias;
  AllSchemes::visit(p.pos.scheme, [&](auto scheme) {
    using S = decltype(scheme);
    if constexpr (HasDistanceBias<S, T>::value) bias = std::make_unique<typename S::template Bias<T>>(p);
  });
  return bias;
}

// Whether scheme S rotates q and k: it has a class template Rotation<T>
// deriving from PositionRotation<T>.
template <class S, class T, class = void>
struct HasRotation : std::false_type {};
template <class S, class T>
struct HasRotation<S, T, std::void_t<typename S::template Rotation<T>>> : std::true_type {};

// The call's rotation of q and k when its scheme has one; nullptr otherwise.
template <class T>
std::unique_ptr<PositionRotation<T>> make_rotation(const AttentionForward<T>& p) {
  std::unique_ptr<PositionRotation<T>> rotation;
  AllSchemes::visit(p.pos.scheme, [&](auto scheme) {
    using S = decltype(scheme);
    if constexpr (HasRotation<S, T>::value) rotation = std::make_unique<typename S::template Rotation<T>>(p);
  });
  return rotation;
}

template <class T>
bool scheme_rotates(Scheme id) {
  bool rotates = false;
  AllSchemes::visit(id, [&](auto scheme) { rotates = HasRotation<decltype(scheme), T>::value; });
  return rotates;
}

inline bool scheme_serves(Scheme id, Algorithm a) {
  bool served = false;
  AllSchemes::visit(id, [&](auto scheme) { served = decltype(scheme)::algorithms.contains(a); });
  return served;
}

}  // namespace relpos
