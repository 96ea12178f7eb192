// NaN and infinity in the inputs, for every scheme variant and every
// algorithm that serves it, in float and double: a key that a mask hides
// from a query (key padding, or its future under a causal mask) contributes
// exactly nothing to that query's output and gradients, whatever its k and
// v hold, and a non-finite value reaches exactly the outputs and gradients
// that depend on it, as NaN or infinity, never as a finite number (a NaN
// logit must not become a probability of 0, a row that sees only a NaN key
// must not come out as a fully masked row's zeros).
//
// Each case runs a problem twice, clean and with some rows poisoned, and
// says for every output element whether it depends on the poison: those
// that do must be non-finite (or, for gradients, may be anything), those
// that do not must equal the clean run's. Sizes span several tiles of the
// fused kernel (128 query rows, 128 keys per backward tile), so that the
// poison sits in tiles the causal mask cuts.
#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "algorithm_cases.hpp"
#include "oracle.hpp"
#include "problem.hpp"

namespace relpos_test {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN(), kInf = std::numeric_limits<double>::infinity();
constexpr int64_t kPoisonedBatch = 0, kPoisonedHead = 1;

enum class Expect { same, nonfinite, any };

// An output element: its tensor (out, lse, dq: per query row; dk, dv: per
// key; anything else a positional parameter's gradient, b = h = row = -1).
struct Element {
  std::string tensor;
  int64_t b, h, row;
};

struct PoisonCase {
  std::string label;
  MaskKind mask;
  std::function<void(Problem<double>&)> poison;                   // on the inputs q, k, v, dout
  std::function<Expect(const Spec&, const Element&)> expectation;  // for each output element
};

bool sees(const Spec& s, int64_t b, int64_t i, int64_t j) { return !oracle::masked(s, b, i, j); }
bool poisoned_head(const Element& e) { return e.b == kPoisonedBatch && e.h == kPoisonedHead; }
bool per_query(const Element& e) { return e.tensor == "out" || e.tensor == "lse" || e.tensor == "dq"; }
bool per_key(const Element& e) { return e.tensor == "dk" || e.tensor == "dv"; }

template <class Tensor4>
void fill_row(Tensor4& t, int64_t b, int64_t h, int64_t row, double value) {
  for (int64_t x = 0; x < t.shape()[3]; ++x) t(b, h, row, x) = value;
}

// Key j's k row NaN and/or its v row infinite (0: left as drawn): the rows
// that see it output NaN or infinity (k: NaN logits, lse too; v: infinite
// outputs, lse unchanged); every other row and every other head is as if the
// key held finite values. Gradients of keys and parameters that any such row
// reaches may be anything, but for dv, which no value reaches, when only v
// is poisoned.
PoisonCase hidden_key(int64_t j, double k_value, double v_value) {
  const bool k_poisoned = k_value != 0, v_poisoned = v_value != 0;  // NaN != 0
  return {"key" + std::to_string(j) + (k_poisoned ? "_k_nan" : "") + (v_poisoned ? "_v_inf" : ""), MaskKind::causal,
          [=](Problem<double>& p) {
            if (k_poisoned) fill_row(p.k, kPoisonedBatch, kPoisonedHead, j, k_value);
            if (v_poisoned) fill_row(p.v, kPoisonedBatch, kPoisonedHead, j, v_value);
          },
          [=](const Spec& s, const Element& e) {
            if (!per_query(e) && !per_key(e)) return Expect::any;
            if (!poisoned_head(e)) return Expect::same;
            if (per_key(e)) return e.tensor == "dv" && !k_poisoned ? Expect::same : Expect::any;
            if (!sees(s, e.b, e.row, j)) return Expect::same;
            if (e.tensor == "lse") return k_poisoned ? Expect::nonfinite : Expect::same;
            return e.tensor == "out" ? Expect::nonfinite : Expect::any;
          }};
}

// Query row i's q (or dout) poisoned: row i outputs NaN (a dout changes no
// output); the keys row i cannot see get exactly the clean gradients.
PoisonCase poisoned_query(int64_t i, bool dout, MaskKind mask) {
  return {std::string(dout ? "dout" : "q") + std::to_string(i) + (mask == MaskKind::causal ? "_causal" : "_padding"),
          mask,
          [=](Problem<double>& p) { fill_row(dout ? p.dout : p.q, kPoisonedBatch, kPoisonedHead, i, dout ? kInf : kNaN); },
          [=](const Spec& s, const Element& e) {
            if (!per_query(e) && !per_key(e)) return Expect::any;
            if (!poisoned_head(e)) return Expect::same;
            if (per_key(e)) return sees(s, e.b, i, e.row) ? Expect::any : Expect::same;
            if (e.row != i) return Expect::same;
            if (e.tensor == "dq") return Expect::any;
            return dout ? Expect::same : Expect::nonfinite;
          }};
}

// Every padded key's k NaN and v infinite, in every head: nothing changes,
// gradients of the padded keys (zero) and of the parameters included.
PoisonCase padded_keys(MaskKind mask) {
  return {std::string("padded_keys_") + (mask == MaskKind::padding ? "padding" : "causal_padding"), mask,
          [](Problem<double>& p) {
            const Spec& s = p.spec;
            for (int64_t b = 0; b < s.B; ++b)
              for (int64_t h = 0; h < s.H; ++h)
                for (int64_t j = 0; j < s.Lk; ++j)
                  if (s.padded(b, j)) fill_row(p.k, b, h, j, kNaN), fill_row(p.v, b, h, j, -kInf);
          },
          [](const Spec&, const Element&) { return Expect::same; }};
}

// A row of Shaw's tables (every head's slice) NaN: under a causal mask the
// row of distances past +k, which no query reaches, changes nothing; without
// a mask the row of distances below -k reaches rows k.. only (rows 0..k-1
// see no key that far back).
PoisonCase table_row(bool causal) {
  return {causal ? "table_row_2k_causal" : "table_row_0", causal ? MaskKind::causal : MaskKind::none,
          [=](Problem<double>& p) {
            for (auto* table : {&p.shaw_wk, &p.shaw_wv})
              if (!table->empty())
                for (int64_t h = 0; h < table->shape()[0]; ++h)
                  for (int64_t x = 0; x < table->shape()[2]; ++x)
                    (*table)(h, causal ? 2 * p.spec.shaw_k : 0, x) = kNaN;
          },
          [=](const Spec& s, const Element& e) {
            const bool shaw = s.has_wk() || s.has_wv();
            if (causal || !shaw) return Expect::same;
            if (!per_query(e)) return Expect::any;
            return e.row < s.shaw_k ? Expect::same : e.tensor == "out" ? Expect::nonfinite : Expect::any;
          }};
}

std::vector<PoisonCase> poison_cases() {
  return {hidden_key(100, kNaN, kInf), hidden_key(100, 0, kInf), hidden_key(130, kNaN, 0), hidden_key(0, kNaN, 0),
          poisoned_query(60, false, MaskKind::causal), poisoned_query(140, true, MaskKind::causal),
          poisoned_query(60, false, MaskKind::padding), padded_keys(MaskKind::padding),
          padded_keys(MaskKind::causal_padding), table_row(true), table_row(false)};
}

template <class T>
void copy_inputs(const Problem<double>& from, Problem<T>& to) {
  const auto copy = [](const auto& src, auto& dst) {
    const std::vector<double> values = src.values();
    const auto elements = dst.elements();
    for (std::size_t n = 0; n < values.size(); ++n) *elements[n] = static_cast<T>(values[n]);
  };
  copy(from.q, to.q), copy(from.k, to.k), copy(from.v, to.v), copy(from.dout, to.dout);
  if (!from.shaw_wk.empty()) copy(from.shaw_wk, to.shaw_wk);
  if (!from.shaw_wv.empty()) copy(from.shaw_wv, to.shaw_wv);
}

template <class T>
void check_case(Spec spec, const PoisonCase& c) {
  spec.mask = c.mask;
  SCOPED_TRACE(c.label + (sizeof(T) == 4 ? ", float" : ", double"));
  Problem<T> clean(spec), poisoned(spec);
  Problem<double> inputs(spec);
  c.poison(inputs);
  copy_inputs(inputs, poisoned);  // clean drew the same values
  const Outcome expected = run_forward_backward(clean), got = run_forward_backward(poisoned);
  const double tol = sizeof(T) == 4 ? 2e-5 : 1e-12;
  int64_t nonfinite_expected = 0;
  for (std::size_t t = 0; t < got.size(); ++t) {
    const auto& [tensor, values] = got[t];
    Element e{tensor, -1, -1, -1};
    const int64_t rows = per_key(e) ? spec.Lk : spec.Lq;
    const bool per_row = per_key(e) || per_query(e);
    const int64_t cols = per_row ? int64_t(values.size()) / (spec.B * spec.H * rows) : 1;
    int bad = 0;
    for (std::size_t n = 0; n < values.size(); ++n) {
      if (per_row) e.row = int64_t(n) / cols % rows, e.b = int64_t(n) / cols / rows / spec.H, e.h = int64_t(n) / cols / rows % spec.H;
      const Expect want = c.expectation(spec, e);
      const double a = values[n], x = expected[t].second[n];
      const bool ok = want == Expect::any || (want == Expect::nonfinite && !std::isfinite(a)) ||
                      (want == Expect::same && std::isfinite(a) && std::abs(a - x) <= tol * (1 + std::abs(x)));
      nonfinite_expected += want == Expect::nonfinite;
      if (!ok && bad++ < 3)
        ADD_FAILURE() << tensor << " (b " << e.b << ", h " << e.h << ", row " << e.row << ") = " << a
                      << (want == Expect::same ? ", expected the clean " + std::to_string(x) : ", expected non-finite");
    }
  }
  if (c.label.rfind("padded", 0) != 0 && c.label.rfind("dout", 0) != 0 && c.label.rfind("table", 0) != 0) {
    EXPECT_GT(nonfinite_expected, 0) << "a case whose poison reaches no output";
  }
}

// One scheme variant and one algorithm that serves it, on 150 queries
// and keys (two query tiles, two backward key tiles of the fused kernel).
std::vector<Spec> nonfinite_cases() {
  std::vector<Spec> out;
  for (Spec s : scheme_variants()) {
    s.Lq = s.Lk = 150, s.H = 2, s.d = 8, s.dv = 4;
    s.mask = MaskKind::causal;  // for `serves`; each poison case sets its own
    for (Algorithm a : every_algorithm())
      if (a != Algorithm::automatic && serves(a, s)) out.push_back(with_algorithm(s, a));
  }
  return out;
}

class NonFinite : public ::testing::TestWithParam<Spec> {};

TEST_P(NonFinite, ReachesExactlyWhatDependsOnIt) {
  for (const PoisonCase& c : poison_cases()) {
    Spec s = GetParam();
    s.mask = c.mask;
    if (!serves(s.algorithm, s)) continue;  // skew: causal only
    check_case<float>(s, c);
    // double runs gemm where float runs the staircase kernel on cut tiles: once per
    // scheme variant, by the fused kernel and the shared unfused pipeline (gather)
    if (s.algorithm == Algorithm::fused || s.algorithm == Algorithm::gather) check_case<double>(s, c);
  }
}

INSTANTIATE_TEST_SUITE_P(EverySchemeAndAlgorithm, NonFinite, ::testing::ValuesIn(nonfinite_cases()), spec_name);

}  // namespace
}  // namespace relpos_test
