// What a position scheme is to the kernels. Each scheme lives in one file of
// this folder, a struct with:
//
//   id, name         its Scheme value and the name frontends use
//   algorithms       the algorithms that serve it (the capability table;
//                    mask and shape conditions of an algorithm live in dispatch)
//   for_each_param   its learnable tensors, with their members in any number of
//                    PositionGrads, by the names frontends use ("t5_table";
//                    its gradient is "dpos.t5_table")
//   check(p)         its arguments, each error naming the argument
//   Bias<T>          for a scheme whose relative term is a bias per (head,
//                    distance): a DistanceBias<T> (below) built from the call,
//                    that bias and the reduction of its gradient to the
//                    scheme's parameters
//   Rotation<T>      for a scheme that rotates q and k by their absolute
//                    positions: a PositionRotation<T> (below)
//   model(p, c)      how relpos's byte-level model (src/nn) holds the scheme:
//                    sets the options of p from the model's configuration c
//                    and returns the learnable tensors the model trains (a
//                    scheme of the registry is a kind of that model; this
//                    header-only part is used by relpos::nn alone, so the
//                    attention library links no model code)
//
// The other kinds of relative term are computed by the kernels themselves and
// selected by the scheme's parameters: a per-distance key embedding read by a
// query-side vector (Shaw's clipped table; Transformer-XL's band W_R R(-r)
// read by q + v), a per-distance value embedding (Shaw) and a content bias
// (Transformer-XL's u).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "relpos/attention.hpp"
#include "relpos/nn/model.hpp"

namespace relpos {

// A set of algorithms, one bit per Algorithm value.
class AlgorithmSet {
 public:
  constexpr AlgorithmSet(std::initializer_list<Algorithm> algorithms) {
    for (Algorithm a : algorithms) bits_ |= bit(a);
  }
  constexpr bool contains(Algorithm a) const { return (bits_ & bit(a)) != 0; }

 private:
  static constexpr unsigned bit(Algorithm a) { return 1u << static_cast<unsigned>(a); }
  unsigned bits_ = 0;
};

// Every algorithm that serves a scheme whose relative term is a bias per
// distance: the reference, the per-distance gathers and the fused kernel.
inline constexpr AlgorithmSet kBiasAlgorithms = {Algorithm::reference, Algorithm::gather, Algorithm::fused};

// A learnable tensor of a scheme in relpos's byte-level model. Its name in
// checkpoints is the for_each_param name "<scheme>_<field>" written
// "<scheme>.<field>" ("t5.table"), prefixed by "layer<l>.attn." for a
// per-layer tensor.
struct ModelTensor {
  const char* name;  // as in for_each_param: "t5_table"
  std::vector<int64_t> shape;
  bool shared = false;  // one tensor for all layers (else one per layer)
  bool ones = false;    // initialised to 1 (else normal(0, 0.02) like the model's matrices)
  // The attention reads the parameter clamped to [floor, ceiling]; an entry
  // outside gets no gradient (it keeps its value: a step back returns it).
  double floor = -std::numeric_limits<double>::infinity();
  double ceiling = std::numeric_limits<double>::infinity();
  bool bounded() const {
    return floor > -std::numeric_limits<double>::infinity() || ceiling < std::numeric_limits<double>::infinity();
  }
  int64_t size() const {
    int64_t n = 1;
    for (int64_t e : shape) n *= e;
    return n;
  }
  // A contiguous view of this shape over data, of the type of `view` (the
  // scheme's member this tensor binds: for_each_param gives it).
  template <class View, class P>
  void bind(View& view, P* data) const {
    std::array<int64_t, std::tuple_size_v<decltype(view.shape)>> dims{};
    if (shape.size() != dims.size()) throw std::logic_error(std::string(name) + ": a model tensor of the wrong rank");
    std::copy(shape.begin(), shape.end(), dims.begin());
    view = View::contiguous(data, dims);
  }
};

// The for_each_param and model of a scheme without learnable tensors (none).
struct NoLearnableTensors {
  template <class Params, class F, class... Grads>
  static void for_each_param(Params&, F&&, Grads&...) {}
  template <class T>
  static std::vector<ModelTensor> model(PositionParams<T>&, const nn::ModelConfig&) {
    return {};
  }
};

// A bias per (head, distance) for the distances of one call,
// r = rmin + m, m < count, rmin = k_offset - (q_offset + Lq - 1),
// count = Lq + Lk - 1 (the same for every head). Built once per call and
// thread; what depends only on the call (T5's buckets) is computed once.
template <class T>
class DistanceBias {
 public:
  DistanceBias(const AttentionForward<T>& p)
      : rmin_(p.k_offset - (p.q_offset + p.q.shape[2] - 1)), count_(p.q.shape[2] + p.k.shape[2] - 1) {}
  virtual ~DistanceBias() = default;

  int64_t rmin() const { return rmin_; }
  int64_t count() const { return count_; }

  // bias[m] for head h, m < count().
  virtual void values(int64_t h, T* bias) const = 0;
  // Adds into g the gradient of the scheme's parameters of head h, given the
  // gradient of the loss with respect to bias[m], m < count().
  virtual void add_grad(const PositionGrads<T>& g, int64_t h, const T* dbias) const = 0;

 protected:
  int64_t distance_magnitude(int64_t m) const {
    const int64_t r = rmin_ + m;
    return r < 0 ? -r : r;
  }

 private:
  int64_t rmin_, count_;
};

// A rotation of every head's query and key rows by their absolute positions,
// built once per call and thread from the call (the angles depend on the
// positions, not on the head): applied to a head's rows as they are loaded
// (direction 1) and to the gradients of the rotated rows before they are
// written back (direction -1, the inverse rotation).
template <class T>
class PositionRotation {
 public:
  virtual ~PositionRotation() = default;
  virtual void queries(T* rows, int direction) const = 0;  // (Lq, d); row i sits at q_offset + i
  virtual void keys(T* rows, int direction) const = 0;     // (Lk, d); row j sits at k_offset + j
};

}  // namespace relpos
