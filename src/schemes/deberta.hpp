// DeBERTa (He et al. 2021), disentangled attention: beside q_i . k_j, a
// content-to-position term q_i . c2p[c(-r)] (a per-distance key embedding
// read by the query) and a position-to-content term k_j . p2c[c(-r)] (a
// per-distance query embedding read by the key), r = key_pos - query_pos,
// c(x) = clamp(bucket(x) + span, 0, 2 span - 1) with DeBERTa's log buckets
// (deberta_row, relpos/position.hpp). -r is transformers' relative position
// query_pos - key_pos; its p2c gathers the keys' rows at clamp(-bucket + span)
// of the transposed positions and transposes back, which is the same row
// c(-r) of the pair (tested against transformers itself).
#pragma once

#include <vector>

#include "checks.hpp"
#include "scheme.hpp"

namespace relpos {

struct DebertaScheme {
  static constexpr Scheme id = Scheme::deberta;
  static constexpr const char* name = "deberta";
  static constexpr AlgorithmSet algorithms = {Algorithm::reference, Algorithm::fused};

  template <class Params, class F, class... Grads>
  static void for_each_param(Params& pos, F&& f, Grads&... g) {
    f("deberta_c2p", pos.deberta.c2p, g.deberta_c2p...);
    f("deberta_p2c", pos.deberta.p2c, g.deberta_p2c...);
  }

  // DeBERTa-v3's proportions (max_relative_positions its training length,
  // twice its buckets) at the demo's training length 32: every distance the
  // model sees past it reads the table's trained edge rows.
  static constexpr ModelOption kBuckets = {
      .key = "deberta_buckets", .fallback = 16, .low = 2, .high = 1 << 20, .help = "DeBERTa log position buckets"};
  static constexpr ModelOption kMaxDistance = {.key = "deberta_max_distance",
                                               .fallback = 32,
                                               .low = 2,
                                               .high = 1 << 30,
                                               .help = "DeBERTa max_relative_positions (the log buckets' reach)"};
  static constexpr std::array<ModelOption, 2> model_options = {kBuckets, kMaxDistance};

  static void check_model(const SchemeModelConfig& c) {
    check_deberta_config(int64_t(kBuckets.value_in(c)), int64_t(kMaxDistance.value_in(c)),
                         "ModelConfig.deberta_buckets", "ModelConfig.deberta_max_distance");
  }

  // The model: per layer, c2p and p2c tables shared by heads (learned as
  // tables, where DeBERTa projects one embedding table by W_K and W_Q).
  template <class T>
  static std::vector<ModelTensor> model(PositionParams<T>& p, const SchemeModelConfig& c) {
    p.deberta.position_buckets = int64_t(kBuckets.value_in(c));
    p.deberta.max_relative_positions = int64_t(kMaxDistance.value_in(c));
    const std::vector<int64_t> shape = {1, 2 * p.deberta.position_buckets, c.width / c.heads};
    return {{"deberta_c2p", shape}, {"deberta_p2c", shape}};
  }

  // Its options other than tensors, each once: f(its SchemeOption, the member of each of pos...).
  template <class F, class... Params>
  static void for_each_option(F&& f, Params&... pos) {
    // <= 0: no buckets; otherwise >= 2 and below max_relative_positions' reach (check_deberta_config).
    f(SchemeOption{.name = "deberta_position_buckets", .member = "deberta.position_buckets", .high = kMaxPosition},
      pos.deberta.position_buckets...);
    f(SchemeOption{.name = "deberta_max_relative_positions",
                   .member = "deberta.max_relative_positions",
                   .low = 1,
                   .high = kMaxPosition},
      pos.deberta.max_relative_positions...);
  }

  // A table of DeBERTa's read at c(-r): c2p by the query, p2c by the key.
  template <class T, View3<const T> DebertaParams<T>::*Table, View3<T> PositionGrads<T>::*Grad>
  struct BucketTable final : IndexedTable<T> {
    static bool applies(const AttentionForward<T>& p) { return !(p.pos.deberta.*Table).empty(); }
    explicit BucketTable(const AttentionForward<T>& p)
        : IndexedTable<T>(p, p.pos.deberta.*Table, Grad), pos_(p.pos.deberta) {}
    int64_t index(int64_t r) const override {
      return deberta_row(-r, pos_.position_buckets, pos_.max_relative_positions);
    }

   private:
    DebertaParams<T> pos_;
  };
  template <class T>
  using KeyEmbedding = BucketTable<T, &DebertaParams<T>::c2p, &PositionGrads<T>::deberta_c2p>;
  template <class T>
  using QueryEmbedding = BucketTable<T, &DebertaParams<T>::p2c, &PositionGrads<T>::deberta_p2c>;

  template <class T>
  static EmbeddingSizes embedding_sizes(const AttentionForward<T>& p) {
    const DebertaParams<T>& s = p.pos.deberta;
    return {.key_width = s.c2p.empty() ? 0 : p.q.shape[3], .query_width = s.p2c.empty() ? 0 : p.q.shape[3],
            .table_rows = 2 * s.span(), .indexed = true};
  }

  template <class T>
  static void check(const AttentionForward<T>& p) {
    using namespace checks;
    const DebertaParams<T>& s = p.pos.deberta;
    const int64_t H = p.q.shape[1], d = p.q.shape[3];
    check_deberta_config(s.position_buckets, s.max_relative_positions);
    if (s.c2p.empty() && s.p2c.empty()) fail("deberta: give c2p, p2c or both");
    const int64_t rows = 2 * s.span();
    for (const auto& [table_name, table] : {std::pair{"deberta.c2p", &s.c2p}, std::pair{"deberta.p2c", &s.p2c}}) {
      if (table->empty()) continue;
      const std::string meaning = "(1 or " + dims("H", H) + ", " + dims("2 span", rows) + ", " + dims("d", d) + ")";
      check_shape(table_name, *table, {-1, rows, d}, meaning);
      if (table->shape[0] != 1 && table->shape[0] != H) fail(std::string(table_name) + ": expected shape " + meaning);
    }
  }
};

template <>
struct SchemeOf<Scheme::deberta> : std::type_identity<DebertaScheme> {};

}  // namespace relpos
