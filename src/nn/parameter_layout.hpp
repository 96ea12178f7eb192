// Where each parameter of the model lives in the flat parameter buffer, and
// how it is initialised. One layout serves the float model and the double one
// of the gradient tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "../schemes/registry.hpp"
#include "normal_rng.hpp"
#include "relpos/nn/model.hpp"

namespace relpos::nn {

constexpr int64_t kVocabulary = 256;
constexpr double kInitStd = 0.02;

// The attention scheme of the model's position kind: sets its id and options
// in p and returns the scheme's tensors the model trains (for the absolute
// kinds: scheme none, no tensors).
template <class T>
std::vector<ModelTensor> position_scheme(const ModelConfig& c, PositionParams<T>& p) {
  std::vector<ModelTensor> tensors;
  AllSchemes::for_each([&](auto scheme) {
    using S = decltype(scheme);
    if constexpr (ModelScheme<S>) {
      if (c.position != S::name) return;
      p.scheme = S::id;
      tensors = S::model(p, c);
    }
  });
  return tensors;
}

// Offsets into the parameter buffer; -1 = the configuration has no such tensor.
struct LayerOffsets {
  int64_t ln1_weight = -1, ln1_bias = -1, qkv_weight = -1, qkv_bias = -1, out_weight = -1, out_bias = -1;
  std::vector<int64_t> position;  // per entry of ParameterLayout::position_tensors (a shared one: the same in every layer)
  int64_t ln2_weight = -1, ln2_bias = -1, up_weight = -1, up_bias = -1, down_weight = -1, down_bias = -1;
};

struct ParameterLayout {
  int64_t embedding = -1, learned_positions = -1;
  std::vector<ModelTensor> position_tensors;  // the position scheme's, see position_scheme
  std::vector<LayerOffsets> layers;
  int64_t final_weight = -1, final_bias = -1;
  std::vector<ParameterInfo> table;
  std::vector<double> init_std;  // per table entry: > 0 normal(0, std), 0 zeros, -1 ones
  int64_t total = 0;

  explicit ParameterLayout(const ModelConfig& c) {
    const int64_t w = c.width, f = c.ffn;
    // GPT-2's scaling: each residual branch output starts smaller, so the sum
    // over 2 * layers branches keeps the stream's scale.
    const double residual_std = kInitStd / std::sqrt(2.0 * c.layers);
    embedding = add("embedding.weight", {kVocabulary, w}, true, kInitStd);
    if (c.position == "learned") learned_positions = add("positions.learned", {c.context, w}, false, kInitStd);
    PositionParams<double> options;  // only the tensors' list is wanted here
    position_tensors = position_scheme(c, options);
    std::vector<int64_t> position(position_tensors.size(), -1);
    for (std::size_t i = 0; i < position.size(); ++i)
      if (position_tensors[i].shared) position[i] = add_position_tensor("", c.position, position_tensors[i]);
    for (int l = 0; l < c.layers; ++l) {
      const std::string p = "layer" + std::to_string(l) + ".";
      LayerOffsets o;
      o.ln1_weight = add(p + "ln1.weight", {w}, false, -1);
      o.ln1_bias = add(p + "ln1.bias", {w}, false, 0);
      o.qkv_weight = add(p + "attn.qkv.weight", {3 * w, w}, true, kInitStd);
      o.qkv_bias = add(p + "attn.qkv.bias", {3 * w}, false, 0);
      o.position = position;
      for (std::size_t i = 0; i < position.size(); ++i)
        if (!position_tensors[i].shared) o.position[i] = add_position_tensor(p + "attn.", c.position, position_tensors[i]);
      o.out_weight = add(p + "attn.out.weight", {w, w}, true, residual_std);
      o.out_bias = add(p + "attn.out.bias", {w}, false, 0);
      o.ln2_weight = add(p + "ln2.weight", {w}, false, -1);
      o.ln2_bias = add(p + "ln2.bias", {w}, false, 0);
      o.up_weight = add(p + "ffn.up.weight", {f, w}, true, kInitStd);
      o.up_bias = add(p + "ffn.up.bias", {f}, false, 0);
      o.down_weight = add(p + "ffn.down.weight", {w, f}, true, residual_std);
      o.down_bias = add(p + "ffn.down.bias", {w}, false, 0);
      layers.push_back(o);
    }
    final_weight = add("final_ln.weight", {w}, false, -1);
    final_bias = add("final_ln.bias", {w}, false, 0);
  }

  // Fills every tensor in table order from one generator seeded by `seed`.
  template <class T>
  void initialise(uint64_t seed, T* params) const {
    NormalRng rng(seed);
    for (std::size_t i = 0; i < table.size(); ++i) {
      T* p = params + table[i].offset;
      for (int64_t n = 0; n < table[i].size; ++n)
        p[n] = init_std[i] > 0 ? static_cast<T>(init_std[i] * rng.normal()) : T(init_std[i] < 0 ? 1 : 0);
    }
  }

 private:
  // A scheme's tensor under its checkpoint name: "<scheme>_<field>" becomes
  // prefix + "<scheme>.<field>" ("t5_table" -> "t5.table").
  int64_t add_position_tensor(const std::string& prefix, const std::string& scheme, const ModelTensor& t) {
    std::string name = t.name;
    if (name.starts_with(scheme + "_")) name[scheme.size()] = '.';
    return add(prefix + name, t.shape, false, t.ones ? -1 : kInitStd);
  }

  int64_t add(const std::string& name, std::vector<int64_t> shape, bool decay, double std) {
    int64_t size = 1;
    for (int64_t s : shape) size *= s;
    table.push_back({name, total, size, std::move(shape), decay});
    init_std.push_back(std);
    total += size;
    return total - size;
  }
};

}  // namespace relpos::nn
