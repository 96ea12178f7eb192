// What a position scheme is to the kernels. Each scheme lives in one file of
// this folder, a struct with:
//
//   id, name         its Scheme value and the name frontends use
//   algorithms       the algorithms that serve it (the capability table;
//                    mask and shape conditions of an algorithm live in dispatch)
//   for_each_param   its learnable tensors, with their members in any number of
//                    PositionGrads, by the names frontends use ("t5_table";
//                    its gradient is "dpos.t5_table")
//   check(p)         its arguments (each option's own range is checked before,
//                    from for_each_option), each error naming the argument
//   Bias<T>          for a scheme whose relative term is a bias per (head,
//                    distance): a DistanceBias<T> (below) built from the call,
//                    that bias and the reduction of its gradient to the
//                    scheme's parameters
//   Rotation<T>      for a scheme that rotates q and k by their absolute
//                    positions: a PositionRotation<T> (below)
//   KeyEmbedding<T>  for a scheme with an embedding per distance read by the
//                    query (Shaw's key table, Transformer-XL's W_R R): a
//                    DistanceEmbedding<T> (below), often a ClippedTable<T>
//   ValueEmbedding<T> for one with an embedding per distance added to the
//                    values (Shaw's value table): a DistanceEmbedding<T>
//   QueryEmbedding<T> for one with an embedding per distance read by the key
//                    (DeBERTa's position-to-content term): an IndexedTable<T>
//   QueryBias<T>     for one that adds a vector per head to the query
//                    (Transformer-XL's u and v): a QueryBiases<T> (below)
//   GridBias<T>      for one on a grid with a bias per (head, offset on both
//                    axes) (Swin): a GridBias<T> (below)
//   GridEmbedding<T> for one on a grid with a table per axis read by the
//                    query (SAM's decomposed terms): a GridEmbedding<T>
//   grid_shape       on a grid: the query's and key's grids (GridShape)
//   embedding_sizes  with a Key-, Value- or QueryEmbedding: their sizes for
//                    the scratch estimate, before anything is built
//   for_each_option  its options that are not tensors (Shaw's k), each once as
//                    a SchemeOption (below) with its member: checked against
//                    its range, copied between element types for half
//                    storage, read by the Python binding, exported to the
//                    Python records
//   model(p, c)      how relpos's byte-level model (src/nn) holds the scheme:
//                    sets the options of p from the model's configuration c
//                    and returns the learnable tensors the model trains (a
//                    scheme of the registry is a kind of that model; this
//                    header-only part is used by relpos::nn alone, so the
//                    attention library links no model code)
//
// A term class has a constructor from the call and may have a static
// applies(call): false when this call has no such term (Shaw without a value
// table); the bases below answer true. The kernels know these kinds of term
// only, never a scheme by name.
#pragma once

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "../backend/scratch.hpp"
#include "checks.hpp"
#include "relpos/attention.hpp"
#include "relpos/position.hpp"
#include "relpos/scheme_model.hpp"

namespace relpos {

// The scheme type of an enum value: each scheme's file names its type by
// specialising this (`template <> struct SchemeOf<Scheme::alibi> :
// std::type_identity<AlibiScheme> {};`), and registry.hpp makes the list of
// schemes from the enum's values (a value no file names fails the build there).
template <Scheme id>
struct SchemeOf {};

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

// One of a scheme's options that is not a tensor, declared once in its
// scheme's file and given with its member by `for_each_option`: the name the
// Python binding, the Python record and the torch module read ("shaw_k"), the
// member as C++ messages name it ("shaw.k"), and the values it takes.
// Validation checks every option of the call's scheme against it
// (checks::check_option) before the scheme's own checks across options; the
// binding exports the table (relpos._relpos.scheme_options(), written to
// python/relpos/scheme_options.json, from which the Python records take each
// option's kind, default and range).
struct SchemeOption {
  const char* name;
  const char* member;
  double low = -std::numeric_limits<double>::infinity();  // a number's smallest value
  double high = std::numeric_limits<double>::infinity();  // and its largest
  bool low_open = false;                                   // low itself refused
  bool even = false;
  bool zero_is_none = false;  // an integer whose 0 means "none given" (None in Python), outside its range
  // Said after the range in messages: what a special value means; with
  // zero_is_none what 0 (None in Python) does, after "0 " or "None ".
  const char* note = "";
  std::array<const char*, 4> choices{};  // an enum's names in its values' order, then nullptr
};

namespace checks {

// A number in the shortest form that reads back as it: 0.9999999, not 1.
template <class X>
std::string shortest_text(X x) {
  char text[64];
  const auto [end, error] = std::to_chars(text, text + sizeof text, x);
  (void)error;  // 64 characters hold any double or int64
  return std::string(text, end);
}

// A bound as messages print it: 2^40 rather than 1099511627776, 1 rather than 1.0.
inline std::string bound_text(double x) {
  const bool whole = x == std::floor(x) && std::abs(x) < 9e15;
  if (whole && x >= 65536 && (int64_t(x) & (int64_t(x) - 1)) == 0) return "2^" + std::to_string(std::ilogb(x));
  return whole ? std::to_string(int64_t(x)) : shortest_text(x);
}

// What an option's range allows, as the Python records say it too
// (relpos/schemes.py, Option.range_text): "finite and > 1", ">= 0 and <= 2^40".
inline std::string range_text(const SchemeOption& o, bool real) {
  std::string text = real ? "finite" : "";
  const auto part = [&](const std::string& p) { text += (text.empty() ? "" : " and ") + p; };
  if (o.even) part("even");
  if (o.low > -std::numeric_limits<double>::infinity()) part((o.low_open ? "> " : ">= ") + bound_text(o.low));
  if (o.high < std::numeric_limits<double>::infinity()) part("<= " + bound_text(o.high));
  return text;
}

// Throws std::invalid_argument naming o.member unless `value` lies in o's
// range (a number) or names one of its choices (an enum).
template <class X>
void check_option(const SchemeOption& o, X value) {
  if constexpr (std::is_enum_v<X>) {
    const auto at = static_cast<std::size_t>(value);
    if (at < o.choices.size() && o.choices[at] != nullptr) return;
    std::string values;
    for (std::size_t n = 0; n < o.choices.size() && o.choices[n]; ++n)
      values += (n ? ", " : "") + std::string(o.choices[n]) + " (" + std::to_string(n) + ")";
    fail(std::string(o.member) + ": must be one of " + values + ", got " + std::to_string(int64_t(value)));
  } else if constexpr (!std::is_same_v<X, bool>) {
    static_assert(std::is_integral_v<X> || std::is_floating_point_v<X>, "an option is a bool, an enum or a number");
    if (o.zero_is_none && value == 0) return;
    constexpr bool real = std::is_floating_point_v<X>;
    const double x = double(value);
    bool inside = (!real || std::isfinite(x)) && (o.low_open ? x > o.low : x >= o.low) && x <= o.high;
    if constexpr (std::is_integral_v<X>) inside = inside && !(o.even && value % 2 != 0);  // even: integers only
    if (inside) return;
    const std::string note = *o.note ? std::string(" (") + (o.zero_is_none ? "0 " : "") + o.note + ")" : "";
    fail(std::string(o.member) + ": must be " + range_text(o, real) + note + ", got " + shortest_text(value));
  }
}

}  // namespace checks

// One of a scheme's options in relpos's byte-level model, declared once in
// its scheme's file: its key in SchemeModelConfig::scheme_options and in the
// model configuration's text form (its command-line flag is the key with '-'
// for '_': "--shaw-k"), its default, what it means, and the range
// nn::ModelConfig::validate holds it to: a whole number in [low, high], or a
// real number finite and in (low, high]. A scheme lists its options as
// `static constexpr std::array<ModelOption, N> model_options`, reads them with
// `value_in`, and may add checks across options as
// `static void check_model(const SchemeModelConfig&)`.
struct ModelOption {
  const char* key;
  bool integer = true;
  double fallback = 0;  // the default
  double low = 0, high = 0;
  const char* help = "";

  // The option's value in c: its entry in c.scheme_options, else the default.
  double value_in(const SchemeModelConfig& c) const {
    const auto it = c.scheme_options.find(key);
    return it == c.scheme_options.end() ? fallback : it->second;
  }
};

// ModelConfig's error for a field: "ModelConfig.<field>: <why>".
[[noreturn]] inline void model_config_error(const std::string& field, const std::string& why) {
  throw std::invalid_argument("ModelConfig." + field + ": " + why);
}

// The for_each_param and model of a scheme without learnable tensors (none).
struct NoLearnableTensors {
  template <class Params, class F, class... Grads>
  static void for_each_param(Params&, F&&, Grads&...) {}
  template <class T>
  static std::vector<ModelTensor> model(PositionParams<T>&, const SchemeModelConfig&) {
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
  static bool applies(const AttentionForward<T>&) { return true; }

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
  static bool applies(const AttentionForward<T>&) { return true; }
  virtual void queries(T* rows, int direction) const = 0;  // (Lq, d); row i sits at q_offset + i
  virtual void keys(T* rows, int direction) const = 0;     // (Lk, d); row j sits at k_offset + j
};

template <class T>
class ClippedTable;
template <class T>
class IndexedTable;

// An embedding per (head, distance) for the distances of one call,
// r = rmin + m, m < count (as DistanceBias). A key embedding e adds
// qp_i . e(r_ij) to the logit of (i, j), qp the query of the relative term
// (q, or q plus a QueryBiases position vector); a query embedding adds
// k_j . e(r_ij); a value embedding adds P_ij e(r_ij) to out_i. Logit terms
// are scaled like q_i . k_j. Built once per call and thread.
template <class T>
class DistanceEmbedding {
 public:
  DistanceEmbedding(const AttentionForward<T>& p, int64_t width)
      : rmin_(p.k_offset - (p.q_offset + p.q.shape[2] - 1)), count_(p.q.shape[2] + p.k.shape[2] - 1), width_(width) {}
  virtual ~DistanceEmbedding() = default;
  static bool applies(const AttentionForward<T>&) { return true; }

  int64_t rmin() const { return rmin_; }
  int64_t count() const { return count_; }
  int64_t width() const { return width_; }

  // E (n, width): head h's rows of the distances rmin + m, m < n (n may pass
  // count; a distance without an embedding gets a zero row).
  virtual void rows(int64_t h, int64_t n, T* E) const = 0;
  // Adds into g the gradient of the scheme's parameters given dE (n, width),
  // the gradient of the loss with respect to those rows.
  virtual void add_rows_grad(const PositionGrads<T>& g, int64_t h, int64_t n, const T* dE) const = 0;
  // The same embedding as a small table indexed by clipped distance, which
  // lets a kernel multiply by the table instead of one row per distance;
  // null when every distance has its own row.
  virtual const ClippedTable<T>* clipped() const { return nullptr; }
  // The same embedding as a table with a row for every distance's index
  // (DeBERTa's buckets); null otherwise.
  virtual const IndexedTable<T>* indexed() const { return nullptr; }

 private:
  int64_t rmin_, count_, width_;
};

// An embedding per distance held as a table (1 or H, rows, width): distance
// r reads row row_of(r) (-1: no embedding, a zero row), which lets a kernel
// multiply by the small table and pick or gather by row. `grad` names its
// gradient in PositionGrads.
template <class T>
class TableEmbedding : public DistanceEmbedding<T> {
 public:
  TableEmbedding(const AttentionForward<T>& p, const View3<const T>& table, View3<T> PositionGrads<T>::*grad)
      : DistanceEmbedding<T>(p, table.shape[2]), table_(table), grad_(grad) {}

  virtual int64_t row_of(int64_t r) const = 0;
  int64_t table_rows() const { return table_.shape[1]; }
  int64_t slice_of(int64_t h) const { return table_.shape[0] == 1 ? 0 : h; }  // heads of one slice share it (its gradient has its shape)
  bool wants_grad(const PositionGrads<T>& g) const { return !(g.*grad_).empty(); }

  // dense (table_rows, width) = head h's slice of the table.
  void slice(int64_t h, T* dense) const {
    const int64_t ht = slice_of(h), width = this->width();
    for (int64_t c = 0; c < table_rows(); ++c)
      for (int64_t x = 0; x < width; ++x) dense[c * width + x] = table_(ht, c, x);
  }
  // The gradient of head h's slice, dense (table_rows, width), into g.
  void add_slice_grad(const PositionGrads<T>& g, int64_t h, const T* dense) const {
    const View3<T>& grad = g.*grad_;
    if (grad.empty()) return;
    const int64_t ht = slice_of(h), width = this->width();
    for (int64_t c = 0; c < table_rows(); ++c)
      for (int64_t x = 0; x < width; ++x) grad(ht, c, x) += dense[c * width + x];
  }

  void rows(int64_t h, int64_t n, T* E) const override {
    const int64_t ht = slice_of(h), width = this->width();
    for (int64_t m = 0; m < n; ++m) {
      const int64_t c = row_of(this->rmin() + m);
      for (int64_t x = 0; x < width; ++x) E[m * width + x] = c >= 0 ? table_(ht, c, x) : T(0);
    }
  }
  void add_rows_grad(const PositionGrads<T>& g, int64_t h, int64_t n, const T* dE) const override {
    const View3<T>& grad = g.*grad_;
    if (grad.empty()) return;
    const int64_t ht = slice_of(h), width = this->width();
    for (int64_t m = 0; m < n; ++m)
      if (const int64_t c = row_of(this->rmin() + m); c >= 0)
        for (int64_t x = 0; x < width; ++x) grad(ht, c, x) += dE[m * width + x];
  }

 private:
  View3<const T> table_;
  View3<T> PositionGrads<T>::*grad_;
};

// The table (1 or H, 2k+1, width) read at row c(r) = clip(r, -k, k) + k
// (shaw_index): beyond +-k the edge rows, or no embedding (Beyond::zero).
template <class T>
class ClippedTable : public TableEmbedding<T> {
 public:
  ClippedTable(const AttentionForward<T>& p, const View3<const T>& table, int64_t k, Beyond beyond,
               View3<T> PositionGrads<T>::*grad)
      : TableEmbedding<T>(p, table, grad), k_(k), beyond_(beyond) {}

  int64_t k() const { return k_; }
  bool repeats_edges() const { return beyond_ == Beyond::clip; }
  int64_t row(int64_t r) const { return shaw_index(r, k_, beyond_); }  // -1: no embedding
  int64_t row_of(int64_t r) const override { return row(r); }
  const ClippedTable<T>* clipped() const override { return this; }

 private:
  int64_t k_;
  Beyond beyond_;
};

// The table (1 or H, rows, width) read at a row for every distance, index(r)
// (DeBERTa's log buckets, clamped to the table): a kernel multiplies by the
// table and picks each pair's product by index.
template <class T>
class IndexedTable : public TableEmbedding<T> {
 public:
  using TableEmbedding<T>::TableEmbedding;
  virtual int64_t index(int64_t r) const = 0;  // in [0, table_rows())
  int64_t row_of(int64_t r) const override { return index(r); }
  const IndexedTable<T>* indexed() const override { return this; }
};

// Vectors per head added to the query: qc = q + content vector multiplies
// the keys, qp = q + position vector the key embedding.
template <class T>
class QueryBiases {
 public:
  virtual ~QueryBiases() = default;
  static bool applies(const AttentionForward<T>&) { return true; }
  // Head h's rows (lq, d): qp = qc + position vector, then qc += content vector.
  virtual void apply(int64_t h, int64_t lq, int64_t d, T* qc, T* qp) const = 0;
  // Adds into g the vectors' gradients given dqc, dqp (lq, d), the
  // gradients with respect to qc and qp.
  virtual void add_grad(const PositionGrads<T>& g, int64_t h, int64_t lq, int64_t d, const T* dqc,
                        const T* dqp) const = 0;
};

// The grids of a call whose positions lie on one (docs/design.md, "Positions
// on a grid"): query row i at cell (i / qw, i % qw) of qh x qw, key row j at
// (j / kw, j % kw) of kh x kw; rows_y, rows_x: the rows of each axis's
// offsets (grid_offset_rows). All zero: not on a grid.
struct GridShape {
  int64_t qh = 0, qw = 0, kh = 0, kw = 0;
  int64_t rows_y() const { return grid_offset_rows(qh, kh); }
  int64_t rows_x() const { return grid_offset_rows(qw, kw); }
  bool empty() const { return qh == 0; }
};

namespace checks {
// Lq and Lk are the cells of the call's query and key grids (q_name and
// k_name say which options make them), one row per cell, row-major.
template <class T>
void check_grid(const AttentionForward<T>& p, const GridShape& g, const char* q_name, const char* k_name) {
  const auto cells = [](int64_t h, int64_t w) {
    return std::to_string(h) + " x " + std::to_string(w) + " = " + std::to_string(h * w) + " cells";
  };
  if (g.qh * g.qw != p.q.shape[2])
    fail(std::string(q_name) + ": " + cells(g.qh, g.qw) + ", but q has Lq=" + std::to_string(p.q.shape[2]) +
         " rows (one per cell, row by row)");
  if (g.kh * g.kw != p.k.shape[2])
    fail(std::string(k_name) + ": " + cells(g.kh, g.kw) + ", but k has Lk=" + std::to_string(p.k.shape[2]) +
         " rows (one per cell, row by row)");
}
}  // namespace checks

// A call's offsets on its grids, each pair's per axis as the index of that
// axis's rows (grid_offset_index), listed once per call and thread: by_y
// (qh x kh) and by_x (qw x kw), int32.
class GridAxes {
 public:
  explicit GridAxes(const GridShape& g) : shape_(g), by_y_(g.qh * g.kh), by_x_(g.qw * g.kw) {
    for (int64_t a = 0; a < g.qh; ++a)
      for (int64_t b = 0; b < g.kh; ++b) by_y_[a * g.kh + b] = int32_t(grid_offset_index(a, b, g.qh, g.kh));
    for (int64_t a = 0; a < g.qw; ++a)
      for (int64_t b = 0; b < g.kw; ++b) by_x_[a * g.kw + b] = int32_t(grid_offset_index(a, b, g.qw, g.kw));
  }
  const GridShape& shape() const { return shape_; }
  // The y offset's index of query cell row yq and key cell row yk.
  int32_t y(int64_t yq, int64_t yk) const { return by_y_[yq * shape_.kh + yk]; }
  // The x offsets' indices of query cell column xq against key columns 0 .. kw - 1.
  const int32_t* x_of(int64_t xq) const { return &by_x_[xq * shape_.kw]; }
  // Bytes a GridAxes of shape g holds (the fused kernel's scratch plan).
  static int64_t bytes(const GridShape& g) { return (g.qh * g.kh + g.qw * g.kw) * int64_t(sizeof(int32_t)); }

 private:
  GridShape shape_;
  Scratch<int32_t> by_y_, by_x_;
};

// A bias per (head, y offset, x offset) of a call on a grid (Swin's): the
// logit of (i, j) gains table[y(i, j) * rows_x + x(i, j)] of head h.
template <class T>
class GridBias {
 public:
  explicit GridBias(const GridShape& g) : axes_(g) {}
  virtual ~GridBias() = default;
  static bool applies(const AttentionForward<T>&) { return true; }
  const GridAxes& axes() const { return axes_; }
  // Head h's (rows_y * rows_x) values, by y offset then x offset.
  virtual void values(int64_t h, T* table) const = 0;
  virtual bool wants_grad(const PositionGrads<T>& g) const = 0;
  // Adds into g the gradient of head h's values, dtable (rows_y * rows_x).
  virtual void add_grad(const PositionGrads<T>& g, int64_t h, const T* dtable) const = 0;

 private:
  GridAxes axes_;
};

// A table per axis of a call on a grid, read by the query and shared by the
// heads (SAM's decomposed terms): the logit of (i, j) gains, unscaled,
// q_i . ry[y(i, j)] + q_i . rx[x(i, j)], ry (rows_y, d), rx (rows_x, d).
template <class T>
class GridEmbedding {
 public:
  explicit GridEmbedding(const GridShape& g) : axes_(g) {}
  virtual ~GridEmbedding() = default;
  static bool applies(const AttentionForward<T>&) { return true; }
  const GridAxes& axes() const { return axes_; }
  // ry then rx, one dense (rows_y + rows_x, d) block.
  virtual void tables(T* ryx) const = 0;
  virtual bool wants_grad(const PositionGrads<T>& g) const = 0;
  // Adds into g the tables' gradient, dryx (rows_y + rows_x, d) as tables() lays them out.
  virtual void add_grad(const PositionGrads<T>& g, const T* dryx) const = 0;

 private:
  GridAxes axes_;
};

// The sizes of a scheme's embeddings, known from its arguments alone (the
// fused kernel's scratch plan reads them before validation builds anything).
struct EmbeddingSizes {
  int64_t key_width = 0, value_width = 0, query_width = 0;  // 0: no such embedding
  int64_t table_rows = 0;  // a ClippedTable's 2k+1 or an IndexedTable's rows; 0: a row per distance
  int64_t per_distance = 0;                // scratch per distance the key embedding needs (per call)
  bool indexed = false;                    // the tables are IndexedTables (else ClippedTables)
};

}  // namespace relpos
