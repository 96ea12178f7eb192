// The transformer behind relpos::nn::Model, templated on the number type so
// that tests check its gradients by central differences in double. The public
// Model is ModelImpl<float> behind a pimpl.
//
// Block l (pre-LayerNorm, GPT-2 style):
//   mid    = input + out_proj(attention(qkv_proj(ln1(input))))
//   output = mid + down(gelu(up(ln2(mid))))
// then final_ln and the output head, tied to the byte embedding:
//   logits = final_ln(stream) E^T.
// The first block's input is embed_scale() * E[byte] plus the absolute
// position embedding, if any.
// Tying follows GPT-2 / nanoGPT; for 256 bytes it saves a (256, width) matrix
// and gives the rare bytes of a small corpus an output row trained by their
// inputs as well. The layers' arithmetic lives in MicroBatchPass (mixed
// precision included); this class owns the parameters and their gradients
// and splits a call's batch into micro-batches.
//
// Micro-batches: a loss (and its gradients) over `batch` sequences is computed
// as passes over groups of whole sequences, each holding at least
// micro_batch_tokens tokens, their losses and gradients summed in a fixed
// order. The split depends on the batch and length only, never on the thread
// count. When there are at least as many micro-batches as threads, the passes
// run side by side, one thread each (data parallelism: a model this small
// keeps one core busy with a GEMM of 512 rows but not two); otherwise one
// after the other with every thread on each. Either way each pass's numbers
// are those of one thread, so the results do not depend on the thread count.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "../backend/parallel.hpp"
#include "../backend/signals.hpp"
#include "micro_batch_pass.hpp"
#include "model_state.hpp"
#include "relpos/attention.hpp"
#include "training_dropout.hpp"

namespace relpos::nn {

// KVCache with keys and values of any number type (the public KVCache is the
// float one; the double model of the tests uses KVCacheOf<double>).
template <class T>
struct KVCacheOf {
  int batch = 0, capacity = 0, length = 0;
  int64_t position = 0;
  std::vector<std::vector<T>> keys, values;
};

// Sets OpenMP's thread count for the GEMM library inside a call, restoring it after.
class OmpThreadsScope {
 public:
  explicit OmpThreadsScope(int threads) : saved_(omp_get_max_threads()) { omp_set_num_threads(threads); }
  ~OmpThreadsScope() { omp_set_num_threads(saved_); }
  OmpThreadsScope(const OmpThreadsScope&) = delete;
  OmpThreadsScope& operator=(const OmpThreadsScope&) = delete;

 private:
  int saved_;
};


// A training step's micro-batches hold at least this many tokens each: the
// layers' GEMMs then have >= 512 rows, where one thread runs them near its
// peak (fewer rows lose more to the GEMMs' edges than threads gain).
constexpr int64_t kMicroBatchTokens = 512;

// Calls taking a cache accept KVCache or KVCacheOf<T> (any type with batch,
// capacity, length, position, keys and values as in KVCache, holding T).
template <class T>
class ModelImpl {
 public:
  explicit ModelImpl(const ModelConfig& config) : state_(config) { grads_.assign(state_.params.size(), T(0)); }
  ModelImpl(const ModelImpl&) = delete;  // its passes refer to its state
  ModelImpl& operator=(const ModelImpl&) = delete;

  const ModelConfig& config() const { return state_.config; }
  const ParameterLayout& layout() const { return state_.layout; }
  std::vector<T>& parameters() { return state_.params; }
  const std::vector<T>& parameters() const { return state_.params; }
  std::vector<T>& gradients() { return grads_; }
  int num_threads = 0;
  Precision precision = Precision::float32;
  int64_t micro_batch_tokens = kMicroBatchTokens;  // see the file's comment; >= 1

  // tokens (batch, length + 1): mean cross-entropy of tokens[:, first_scored + 1:]
  // given the preceding ones. With `backward`, gradients are added into
  // gradients(). `memory` gets this segment's keys and values. `dropout`:
  // the attention dropout of a training step (the public Model takes it in
  // forward_backward only; the tests differentiate the loss with it).
  template <class Cache>
  double loss(const uint8_t* tokens, int batch, int length, Cache* memory, int first_scored, bool backward,
              const TrainingDropout& dropout = {}) {
    check_tokens(batch, length, "length");
    if (first_scored < 0 || first_scored >= length)
      throw std::invalid_argument("first_scored: must lie in [0, length), got " + std::to_string(first_scored));
    check_training_dropout(dropout);
    if (micro_batch_tokens < 1)
      throw std::invalid_argument("micro_batch_tokens: must be >= 1, got " + std::to_string(micro_batch_tokens));
    if (memory) check_cache(*memory, batch, length);
    const AsyncSignalsHeld signals;  // the GEMMs' JIT kernels must not host a signal handler
    const int threads = this->threads();
    OmpThreadsScope scope(threads);
    prepare(threads);
    const std::vector<int> first_rows = micro_batch_rows(batch, length);
    const int count = static_cast<int>(first_rows.size()) - 1;
    while (static_cast<int>(passes_.size()) < count) passes_.emplace_back(state_);
    if (backward && static_cast<int>(partial_grads_.size()) < count - 1) partial_grads_.resize(count - 1);
    const T weight = T(1) / static_cast<T>(int64_t(batch) * (length - first_scored));
    std::vector<double> losses(count);
    auto run = [&](int i) {
      MicroBatchPass<T>& pass = passes_[i];
      const int rows = first_rows[i + 1] - first_rows[i];
      const uint8_t* own = tokens + int64_t(first_rows[i]) * (length + 1);
      if (backward) pass.gradients = i == 0 ? grads_.data() : partial_gradients(i - 1);
      pass.forward(own, length + 1, rows, length, memory, first_rows[i], backward, dropout);
      losses[i] = pass.loss(own, weight, first_scored);
      if (backward) pass.backward();
      if (memory) pass.write_to_cache(*memory);
    };
    try {
      if (count >= threads) {
        for (int i = 0; i < count; ++i) passes_[i].threads = 1;
        parallel_for(count, threads, [](int) {}, [&](int, int64_t i) { run(static_cast<int>(i)); });
      } else {
        for (int i = 0; i < count; ++i) {
          passes_[i].threads = threads;
          run(i);
        }
      }
    } catch (...) {
      partial_grads_.clear();  // a failed pass may have left a partial buffer not zero
      throw;
    }
    if (backward) add_partial_gradients(count - 1, threads);
    if (memory) advance(*memory, length);
    double value = 0;
    for (double part : losses) value += part;
    return value;
  }

  // Logits (batch, length, 256) of tokens (batch, length) after `cache`'s
  // positions (none when null), appending their keys and values to it.
  template <class Cache>
  const T* logits(const uint8_t* tokens, int batch, int length, Cache* cache) {
    check_tokens(batch, length, "count");
    if (cache) check_cache(*cache, batch, length);
    const AsyncSignalsHeld signals;
    const int threads = this->threads();
    OmpThreadsScope scope(threads);
    prepare(threads);
    if (passes_.empty()) passes_.emplace_back(state_);
    MicroBatchPass<T>& pass = passes_[0];
    pass.threads = threads;
    pass.forward(tokens, length, batch, length, cache, 0, false);
    if (cache) {
      pass.write_to_cache(*cache);
      advance(*cache, length);
    }
    return pass.logits();
  }

  template <class Cache>
  Cache make_cache(int batch, int capacity) const {
    if (batch < 1) throw std::invalid_argument("batch: must be >= 1, got " + std::to_string(batch));
    if (capacity < 1) throw std::invalid_argument("capacity: must be >= 1, got " + std::to_string(capacity));
    Cache cache;
    cache.batch = batch;
    cache.capacity = capacity;
    const int64_t size = int64_t(batch) * config().heads * capacity * head_dim();
    cache.keys.assign(config().layers, {});
    cache.values.assign(config().layers, {});
    for (int l = 0; l < config().layers; ++l) {
      cache.keys[l].assign(size, T(0));
      cache.values[l].assign(size, T(0));
    }
    return cache;
  }

 private:
  int64_t head_dim() const { return config().width / config().heads; }
  int threads() const {
    if (num_threads < 0 || num_threads > kMaxThreads)
      throw std::invalid_argument("relpos: num_threads: must be in [0, " + std::to_string(kMaxThreads) + "], got " +
                                  std::to_string(num_threads));
    return num_threads > 0 ? num_threads : omp_get_max_threads();
  }

  void prepare(int threads) {
    state_.precision = precision;
    state_.prepare(threads);
  }

  // The first sequence of each micro-batch, then `batch`: as many
  // micro-batches of at least micro_batch_tokens tokens as the batch allows,
  // their sizes differing by at most one sequence.
  std::vector<int> micro_batch_rows(int batch, int length) const {
    const int count = static_cast<int>(std::clamp<int64_t>(int64_t(batch) * length / micro_batch_tokens, 1, batch));
    std::vector<int> first(count + 1);
    for (int i = 0; i <= count; ++i) first[i] = static_cast<int>(int64_t(batch) * i / count);
    return first;
  }

  // Micro-batch i + 1's gradients, zero: they are added into gradients()
  // once every pass has run, and the buffer zeroed in the same sweep.
  T* partial_gradients(int i) {
    if (partial_grads_[i].size() != grads_.size()) partial_grads_[i].assign(grads_.size(), T(0));
    return partial_grads_[i].data();
  }

  // gradients() += the first `count` partial gradients in order (each left
  // zero), then a bounded position tensor gets no gradient where it lies
  // outside its bounds.
  void add_partial_gradients(int count, int threads) {
    for (int i = 0; i < count; ++i) {
      T* part = partial_grads_[i].data();
      for_each_block(threads, static_cast<int64_t>(grads_.size()), kElementBlock, [&](int64_t begin, int64_t size) {
        for (int64_t n = begin; n < begin + size; ++n) {
          grads_[n] += part[n];
          part[n] = T(0);
        }
      });
    }
    const ParameterLayout& layout = state_.layout;
    for (std::size_t i = 0; i < layout.position_tensors.size(); ++i) {
      const ModelTensor& t = layout.position_tensors[i];
      if (!t.bounded()) continue;
      for (int l = 0; l < (t.shared ? 1 : config().layers); ++l) {
        const int64_t offset = layout.layers[l].position[i];
        for (int64_t n = 0; n < t.size(); ++n) {
          const T value = state_.params[offset + n];
          if (value < T(t.floor) || value > T(t.ceiling)) grads_[offset + n] = T(0);
        }
      }
    }
  }

  // After every pass wrote its rows: the cache holds the most recent
  // `capacity` positions and its position advances by the call's length.
  template <class Cache>
  static void advance(Cache& cache, int length) {
    const int take_new = std::min(length, cache.capacity);
    cache.length = std::min(cache.length, cache.capacity - take_new) + take_new;
    cache.position += length;
  }

  static void check_tokens(int batch, int length, const char* length_name) {
    if (batch < 1) throw std::invalid_argument("batch: must be >= 1, got " + std::to_string(batch));
    if (length < 1)
      throw std::invalid_argument(std::string(length_name) + ": must be >= 1, got " + std::to_string(length));
  }

  template <class Cache>
  void check_cache(const Cache& c, int batch, int length) const {
    const int64_t size = int64_t(c.batch) * config().heads * c.capacity * head_dim();
    if (c.batch != batch)
      throw std::invalid_argument("cache: holds batch " + std::to_string(c.batch) + ", call has batch " +
                                  std::to_string(batch));
    if (c.capacity < 1 || c.length < 0 || c.length > c.capacity || c.position < c.length ||
        c.position > kMaxPosition)
      throw std::invalid_argument("cache: inconsistent capacity/length/position (make it with make_cache)");
    if (static_cast<int>(c.keys.size()) != config().layers || static_cast<int>(c.values.size()) != config().layers)
      throw std::invalid_argument("cache: needs one key and one value buffer per layer");
    for (int l = 0; l < config().layers; ++l)
      if (static_cast<int64_t>(c.keys[l].size()) != size || static_cast<int64_t>(c.values[l].size()) != size)
        throw std::invalid_argument("cache: buffers of layer " + std::to_string(l) + " have the wrong size");
    if (c.position + length > kMaxPosition) throw std::invalid_argument("cache: position beyond 2^40");
  }

  ModelState<T> state_;
  std::vector<T> grads_;
  std::vector<MicroBatchPass<T>> passes_;        // one per micro-batch, kept between calls
  std::vector<std::vector<T>> partial_grads_;    // micro-batches 1..: their gradients before the sum
};

}  // namespace relpos::nn
