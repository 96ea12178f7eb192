// What every forward and backward pass of a model reads: its configuration,
// its parameters, and those parameters as the GEMMs and the attention read
// them (rounded to bfloat16 in mixed precision; a bounded position tensor
// clamped to its bounds). Passes over micro-batches run on several threads at
// once and only read it; ModelImpl prepares it once per call.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "../backend/convert.hpp"
#include "linear.hpp"
#include "parameter_layout.hpp"
#include "relpos/gemm.hpp"
#include "relpos/half.hpp"
#include "relpos/position.hpp"
#include "row_loop.hpp"

namespace relpos::nn {

// Elements per parallel work item of the model's element-wise passes
// (rounding, narrowing, summing partial gradients).
constexpr int64_t kElementBlock = 4096;

template <class T>
struct ModelState {
  explicit ModelState(const ModelConfig& c)
      : config((c.validate(), c)), layout(c), clamped(c.layers * layout.position_tensors.size()) {
    params.assign(layout.total, T(0));
    layout.initialise(c.seed, params.data());
    position_scheme(config, scheme_options);
  }

  ModelConfig config;
  ParameterLayout layout;
  std::vector<T> params;
  Precision precision = Precision::float32;
  PositionParams<T> scheme_options;  // the position scheme's id and options; its tensors bound per layer

  bool bf16() const { return precision == Precision::bfloat16; }
  // Whether the GEMMs read bfloat16 operands (mixed precision where the CPU
  // has bfloat16 products): each tensor is then narrowed once where it is
  // written (GemmOperand), the parameters once per call. Set by prepare().
  bool narrow_operands() const { return narrow_operands_; }
  const T* param(int64_t offset) const { return params.data() + offset; }
  // A positional table as the attention reads it; a matrix as float32 GEMMs
  // read it (not kept where narrow_operands()).
  const T* operand(int64_t offset) const { return (bf16() ? operands : params).data() + offset; }
  // A weight matrix as the GEMMs read it.
  GemmOperand<T> matrix(int64_t offset) const {
    if (narrow_operands()) return {nullptr, narrow_params.data() + offset};
    return {operand(offset)};
  }

  // Rounds `count` values that a GEMM or the attention reads next to the
  // precision's storage (nothing in float32).
  void store(T* x, int64_t count, int threads) const {
    if (!bf16()) return;
    for_each_block(threads, count, kElementBlock,
                   [&](int64_t begin, int64_t size) { convert::round_to_bf16(x + begin, size); });
  }

  // Makes operand() and position_params() current for the parameters.
  void prepare(int threads) {
    if constexpr (std::is_same_v<T, float>) narrow_operands_ = bf16() && gemm_bf16_native();
    if (narrow_operands()) {
      // The GEMMs read the matrices in bfloat16; only the attention's
      // tables are read as rounded float32 values.
      narrow_params.resize(params.size());
      convert::row(params.data(), 1, narrow_params.data(), 1, int64_t(params.size()));
      operands.resize(params.size());
      for (std::size_t i = 0; i < layout.position_tensors.size(); ++i) {
        const ModelTensor& t = layout.position_tensors[i];
        for (int l = 0; l < (t.shared ? 1 : config.layers); ++l) {
          const int64_t offset = layout.layers[l].position[i];
          std::copy_n(params.data() + offset, t.size(), operands.data() + offset);
          store(operands.data() + offset, t.size(), threads);
        }
      }
    } else if (bf16()) {
      operands = params;
      store(operands.data(), int64_t(operands.size()), threads);
    }
    for (std::size_t i = 0; i < layout.position_tensors.size(); ++i) {
      const ModelTensor& t = layout.position_tensors[i];
      if (!t.bounded()) continue;
      for (int l = 0; l < config.layers; ++l) {
        const T* data = operand(layout.layers[l].position[i]);
        std::vector<T>& out = clamped[l * layout.position_tensors.size() + i];
        out.resize(t.size());
        for (std::size_t n = 0; n < out.size(); ++n) out[n] = std::clamp(data[n], T(t.floor), T(t.ceiling));
      }
    }
  }

  // The position scheme's parameters for layer l: its options, and its
  // tensors as the attention reads them (after prepare()).
  PositionParams<T> position_params(int l) const {
    PositionParams<T> p = scheme_options;
    for_each_model_tensor(layout.position_tensors, p, [&](std::size_t i, auto& view) {
      const ModelTensor& t = layout.position_tensors[i];
      t.bind(view, t.bounded() ? clamped[l * layout.position_tensors.size() + i].data()
                               : operand(layout.layers[l].position[i]));
    });
    return p;
  }

 private:
  std::vector<T> operands;  // bfloat16: params rounded (narrow_operands(): the position tensors only)
  std::vector<bfloat16> narrow_params;  // narrow_operands(): params in bfloat16
  bool narrow_operands_ = false;
  // Per (layer, bounded position tensor): the tensor clamped to its bounds.
  std::vector<std::vector<T>> clamped;
};

}  // namespace relpos::nn
