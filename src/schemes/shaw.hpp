// Shaw et al. 2018 (and Music Transformer's zero beyond k): a per-distance key
// embedding wk[c(r)] read by the query and a per-distance value embedding
// wv[c(r)], c(r) = clip(r, -k, k) + k, tables shared by heads or per head.
#pragma once

#include "checks.hpp"
#include "scheme.hpp"

namespace relpos {

struct ShawScheme {
  static constexpr Scheme id = Scheme::shaw;
  static constexpr const char* name = "shaw";
  static constexpr AlgorithmSet algorithms = {Algorithm::reference, Algorithm::split,
                                              Algorithm::gather,    Algorithm::skew,
                                              Algorithm::generalized_skew, Algorithm::fused};

  template <class Params, class F, class... Grads>
  static void for_each_param(Params& pos, F&& f, Grads&... g) {
    f("shaw_wk", pos.shaw.wk, g.shaw_wk...);
    f("shaw_wv", pos.shaw.wv, g.shaw_wv...);
  }

  static constexpr ModelOption kClip = {
      .key = "shaw_k", .fallback = 16, .low = 0, .high = 1 << 20, .help = "Shaw clipping distance k"};
  static constexpr std::array<ModelOption, 1> model_options = {kClip};

  // The model: per layer, K and V tables shared by heads, clipped at shaw_k.
  template <class T>
  static std::vector<ModelTensor> model(PositionParams<T>& p, const SchemeModelConfig& c) {
    p.shaw.k = int64_t(kClip.value_in(c));
    const std::vector<int64_t> shape = {1, 2 * p.shaw.k + 1, c.width / c.heads};
    return {{"shaw_wk", shape}, {"shaw_wv", shape}};
  }

  // Its options other than tensors, each once: f(its SchemeOption, the member of each of pos...).
  template <class F, class... Params>
  static void for_each_option(F&& f, Params&... pos) {
    f(SchemeOption{.name = "shaw_k", .member = "shaw.k", .low = 0, .high = kMaxPosition}, pos.shaw.k...);
    f(SchemeOption{.name = "shaw_beyond", .member = "shaw.beyond", .choices = {"clip", "zero"}}, pos.shaw.beyond...);
  }

  // The tables as the kernels read them: clipped tables, each present or not.
  template <class T>
  struct KeyEmbedding final : ClippedTable<T> {
    static bool applies(const AttentionForward<T>& p) { return !p.pos.shaw.wk.empty(); }
    explicit KeyEmbedding(const AttentionForward<T>& p)
        : ClippedTable<T>(p, p.pos.shaw.wk, p.pos.shaw.k, p.pos.shaw.beyond, &PositionGrads<T>::shaw_wk) {}
  };
  template <class T>
  struct ValueEmbedding final : ClippedTable<T> {
    static bool applies(const AttentionForward<T>& p) { return !p.pos.shaw.wv.empty(); }
    explicit ValueEmbedding(const AttentionForward<T>& p)
        : ClippedTable<T>(p, p.pos.shaw.wv, p.pos.shaw.k, p.pos.shaw.beyond, &PositionGrads<T>::shaw_wv) {}
  };
  template <class T>
  static EmbeddingSizes embedding_sizes(const AttentionForward<T>& p) {
    const ShawParams<T>& s = p.pos.shaw;
    return {.key_width = s.wk.empty() ? 0 : p.q.shape[3], .value_width = s.wv.empty() ? 0 : p.v.shape[3],
            .table_rows = 2 * s.k + 1};
  }

  template <class T>
  static void check(const AttentionForward<T>& p) {
    using namespace checks;
    const ShawParams<T>& s = p.pos.shaw;
    const int64_t H = p.q.shape[1];
    if (s.wk.empty() && s.wv.empty()) fail("shaw: give wk, wv or both (K-only, V-only, K+V)");
    const int64_t rows = 2 * s.k + 1;
    struct Table {
      const char* name;
      const View3<const T>* view;
      int64_t width;
    };
    for (const Table& table : {Table{"shaw.wk", &s.wk, p.q.shape[3]}, Table{"shaw.wv", &s.wv, p.v.shape[3]}}) {
      if (table.view->empty()) continue;
      const std::string meaning =
          "(1 or " + dims("H", H) + ", " + dims("2k+1", rows) + ", " + std::to_string(table.width) + ")";
      check_shape(table.name, *table.view, {-1, rows, table.width}, meaning);
      if (table.view->shape[0] != 1 && table.view->shape[0] != H)
        fail(std::string(table.name) + ": expected shape " + meaning);
    }
  }
};

template <>
struct SchemeOf<Scheme::shaw> : std::type_identity<ShawScheme> {};

}  // namespace relpos
