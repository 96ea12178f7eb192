// Random attention problems that own their buffers: the check and the
// benchmarks build one per scheme, in float, double, bfloat16 or float16 with
// the same input values up to rounding, and hand its AttentionBackward params
// to the library.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "relpos/attention.hpp"

namespace relpos::cli {

struct ProblemShape {
  int64_t batch = 2, heads = 4, length = 128, dim = 64;
  bool causal = true;
};

// The largest batch, heads, length and head dimension `relpos check` and the
// benchmarks accept: heads x dim is the width the scheme tables are shaped
// for (an int), and a table's size stays within int64. Their product may
// not: check_fits_memory refuses it, from the estimates below.
inline constexpr int64_t kMaxBatch = int64_t(1) << 20, kMaxHeads = int64_t(1) << 16,
                         kMaxLength = int64_t(1) << 24, kMaxDim = int64_t(1) << 14;

// One row of the check: a scheme and its options.
struct SchemeCase {
  std::string label;
  Scheme scheme = Scheme::none;
  int64_t shaw_k = 16;
  Beyond beyond = Beyond::clip;
  bool t5_bidirectional = false;
  RopeStyle rope_style = RopeStyle::half_split;
  int64_t mem_len = 0;  // Transformer-XL memory prepended to the keys
};

// One case per scheme of the library on a line (not the schemes of positions
// on a grid), in registry order: a scheme's cases in `variants` where it has
// any, else one labelled by its name.
std::vector<SchemeCase> cases_of_every_scheme(const std::vector<SchemeCase>& variants);

// Every scheme of the library by the name the frontends use, in registry
// order, or with on_a_line those whose positions lie on a line (the ones
// check and bench run); scheme_names joins them ("none, shaw, t5, ...").
// Every help that speaks of schemes prints this list (never a retyped one),
// so a new scheme appears in each.
std::vector<std::string> scheme_name_list(bool on_a_line = false);
std::string scheme_names(bool on_a_line = false);

// The schemes `relpos check` runs by default.
std::vector<SchemeCase> check_cases();

template <class T>
struct Problem {
  // Inputs and parameters (values are float-representable, so the float and
  // double problems built from one seed hold exactly the same numbers). The
  // scheme's tables are those the byte-level model trains (its model()).
  std::vector<T> q, k, v, dout;
  std::vector<std::vector<T>> tables;
  // Outputs and gradients.
  std::vector<T> out, dq, dk, dv;
  std::vector<std::vector<T>> dtables;
  std::vector<compute_t<T>> lse;  // float32 for the half types
  AttentionBackward<T> params;  // views into the buffers above

  Problem() = default;
  Problem(const Problem&) = delete;  // a copy's views would point into the original
  Problem(Problem&&) = default;      // moving keeps each vector's storage in place

  // Zeroes every gradient buffer (backward adds into them).
  void clear_grads();
  // The gradient buffers, for error measurement.
  std::vector<const std::vector<T>*> grads() const;
  // The input buffers (q, k, v, dout, the scheme's tables), in a fixed order.
  std::vector<std::vector<T>*> inputs();
};

// Overwrites to's inputs with from's values (problems of one shape and case):
// the float64 reference of a half-precision problem reads the rounded values.
template <class From, class To>
void copy_inputs(Problem<From>& from, Problem<To>& to) {
  const auto source = from.inputs();
  const auto target = to.inputs();
  for (size_t i = 0; i < source.size(); ++i)
    for (size_t n = 0; n < source[i]->size(); ++n) (*target[i])[n] = To(double((*source[i])[n]));
}

template <class T>
Problem<T> make_problem(const ProblemShape& shape, const SchemeCase& c, uint64_t seed);

// What make_problem<T>(shape, c) and the calls on it will need, from the
// shapes alone, before anything is allocated (for check_fits_memory):
//   problem_bytes      the bytes of its buffers;
//   serving_algorithms the algorithms that serve it (measure.hpp's);
//   scratch_bytes      the largest of the library's scratch estimates
//                      (forward + backward) of `algorithms` on it with
//                      `threads` (0: OpenMP's).
// Where a buffer's element count would overflow int64, no algorithm and no
// scratch: problem_bytes is then beyond any machine's memory.
template <class T>
double problem_bytes(const ProblemShape& shape, const SchemeCase& c);
template <class T>
std::vector<Algorithm> serving_algorithms(const ProblemShape& shape, const SchemeCase& c);
template <class T>
double scratch_bytes(const ProblemShape& shape, const SchemeCase& c, const std::vector<Algorithm>& algorithms,
                     int threads = 0);

}  // namespace relpos::cli
