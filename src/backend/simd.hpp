// The float loops of the softmax, GELU, LayerNorm and AdamW, and the small
// products of causal attention tiles, vectorised with Highway for every x86-64
// target (SSE4, AVX2, AVX-512) and dispatched at run time to the best one the
// CPU has, so their speed does not depend on what the
// compiler's auto-vectoriser made of a loop on the build machine (on AVX2 it
// left the softmax's exponentials scalar: 4.5 ns each instead of about 1).
//
// Each vector lane computes what the scalar functions of vexp.hpp and gelu.hpp
// compute, the same operations in the same order; a multiply-add is one
// rounding on targets with FMA (AVX2, AVX-512) and two on the others, so the
// elements agree bit for bit among targets of each kind. Sums and maxima over
// a row are reduced lane-wise, then across lanes: a fixed order per target.
//
// The environment variable RELPOS_SIMD (avx512, avx2, sse4, scalar) limits the
// targets, to test or measure a lesser CPU's path on a better one.
//
// The loops live one family per file, gemma.cpp's way: the per-target code
// in simd_softmax-inl.h, simd_rows-inl.h, simd_convert-inl.h, simd_dropout-inl.h,
// simd_staircase-inl.h and simd_trainer-inl.h, each compiled once per target
// by its .cpp (for this header's functions) and again by the tests
// (tests/cpp/backend/simd_test.cpp), which call every target's functions
// directly, without changing which target dispatch chooses. The helpers more
// than one family uses (the exponential, the lane loops) are in
// simd_common-inl.h; target selection in simd.cpp. Each family's .cpp holds its
// HWY_EXPORT lines and one thin wrapper per function below, written out
// so that each can be read and found by name. The wrappers call
// RELPOS_SIMD_DISPATCH(Name) (simd_dispatch.h), the entry of Name's dispatch
// table for relpos's chosen target: a macro, because it names the table that
// HWY_EXPORT defines in that file, which a function cannot take;
// and only that, not one that also declares the export and the wrapper,
// which would hide the signatures.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace relpos::simd {

// out[i] = exp(x[i] - shift), 0 where x[i] - shift < kSoftmaxCutoff; returns
// the sum of out. out may be x.
float exp_shifted_sum(const float* x, float shift, float* out, int64_t n);
// The softmax's callers shift by at least a row's maximum, so a term below
// e^-44 (< 2^-63) is below 2^-63 of the row's largest and cannot move a
// float32 softmax, while kept it makes subnormal products (P v, P's
// gradient), which Intel CPUs compute through microcode assists: a float32
// ALiBi forward (L = 4096, d = 128, causal, one thread) ran 1.36-1.50x the
// time of plain attention with them, 1.01-1.06x with them flushed.
inline constexpr float kSoftmaxCutoff = -44.0f;
// The vector exp gives infinity above this (e^88 is within a factor 2.1 of
// float's largest; the softmax never asks past 0).
inline constexpr float kExpOverflow = 88.0f;
// max(init, x[0], ..., x[n-1]); NaN if any of them is NaN.
float max_of(const float* x, int64_t n, float init);
// Whether every entry of rows [0, rows) of x (n entries each, row stride ld)
// is finite (no NaN, no infinity).
bool all_finite(const float* x, int64_t rows, int64_t n, int64_t ld);
// The row operations of the attention tiles' epilogues (bias, scale, masks,
// Shaw's bucket sums, the softmax gradient) and of RoPE:
// y += alpha * x;  y += c;  y *= alpha;  the sum of x;  ds = p * (ds - D),
// exactly 0 where p is 0 (a pair the softmax gave nothing gets no gradient,
// also where dP or D is not finite);
// and the rotation of the pairs (a[i], b[i]) by the angles whose cosines and
// sines are c[i], sign * s[i]: a' = a c - b s', b' = b c + a s'.
void add_scaled(float* y, const float* x, float alpha, int64_t n);
void add_scaled_reversed(float* y, const float* x, float alpha, int64_t n);  // y[i] += alpha x[n - 1 - i]
void add_constant(float* y, float c, int64_t n);
void scale(float* y, float alpha, int64_t n);
float sum_of(const float* x, int64_t n);
void softmax_grad(const float* p, float* ds, float D, int64_t n);
void rotate_pairs(float* a, float* b, const float* c, const float* s, float sign, int64_t n);
// Attention dropout's multipliers of one row (relpos/dropout.hpp's layout):
// z[jj] = scale where the entry at key position kp0 + jj (mod 2^32) is kept,
// else 0, for jj < n. The row's Philox key (k0, k1) and counter words c1
// (query position), c2 (batch row and head), c3 (offset); threshold: the
// smallest word that keeps. Every target draws the same bits.
struct DropoutRow {
  uint32_t k0 = 0, k1 = 0, c1 = 0, c2 = 0, c3 = 0, threshold = 0;
  float scale = 1;
};
void dropout_row(const DropoutRow& r, uint32_t kp0, float* z, int64_t n);
// out[jj] = x[jj] times the same multipliers (out may be x), and where z is
// not null z[jj] = the multiplier: one pass for the kernels that apply them.
void dropout_times(const DropoutRow& r, uint32_t kp0, const float* x, float* out, float* z, int64_t n);
// y = gelu(x), the erf form, and where slope is given, slope = gelu'(x)
// (slope may be x: each lane is read before it is written); GELU's backward is
// then multiply(dy, slope, dx): out = a * b.
void gelu_forward(const float* x, float* y, float* slope, int64_t n);
void multiply(const float* a, const float* b, float* out, int64_t n);

// sums[c] += x[r * cols + c] over the rows r = 0..rows-1 in that order (a
// bias gradient); x in float32 or as bfloat16 bits. The same sums, bit for
// bit, as adding row after row.
void add_column_sums(const float* x, int64_t rows, int64_t cols, float* sums);
void add_column_sums_bf16(const uint16_t* x, int64_t rows, int64_t cols, float* sums);
// The sum of x[i]^2 in double (the gradient norm), in a fixed order per target.
double sum_of_squares(const float* x, int64_t n);

// Products of attention tiles that a causal mask cuts along a staircase,
// for tiles of at most kStaircaseMaxSize in depth (sgemm's per-call cost
// dominates there: 64 x 64 x 32 on one Zen 4 core 3.7 us, this 2.0 us with
// the cut, 2.9 us without). c (m x n, row stride ldc) = alpha A B, plus c
// when beta is 1 (beta 0: c is not read), with A(r, p) = a[r a_row + p a_col]
// (a row-major A, or a transposed one) and B (k x n) row-major, row stride
// ldb. In row r the mask hides what lies past r + delta:
//   columns         only c's columns x <= r + delta matter; the others get
//                   the product or zero (beta must be 0): S = q k^T, dP = dout v^T
//   leading_depth   A(r, p) = 0 for p > r + delta, and is skipped: P v, dS k
//   trailing_depth  A(r, p) = 0 for p < r - delta, and is skipped: P^T dout, dS^T q
// With Staircase::none, the whole product. Throws std::logic_error for a
// depth over kStaircaseMaxSize, a beta other than 0 and 1, or a column cut
// asked to accumulate.
enum class Staircase { none, columns, leading_depth, trailing_depth };
constexpr int64_t kStaircaseMaxSize = 128;
struct StaircaseProductArgs {
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1, beta = 0;
  const float* a = nullptr;
  int64_t a_row = 0, a_col = 0;
  const float* b = nullptr;
  int64_t ldb = 0;
  float* c = nullptr;
  int64_t ldc = 0;
  Staircase cut = Staircase::none;
  int64_t delta = 0;
};
void staircase_product(const StaircaseProductArgs& args);
// out (cols x rows, row stride ldo) = the transpose of x (rows x cols, row
// stride ldx); or out += it. A stride may be negative (rows taken or put in
// reverse).
void transpose(const float* x, int64_t rows, int64_t cols, int64_t ldx, float* out, int64_t ldo);
void add_transposed(const float* x, int64_t rows, int64_t cols, int64_t ldx, float* out, int64_t ldo);

// One row of LayerNorm (nn/layer_norm.hpp): the mean and the biased variance
// of x summed lane-wise in float32, out = (x - mean) rstd gamma + beta; and its
// backward, dx += rstd (g - mean(g) - xhat mean(g xhat)) with g = dout gamma.
void layer_norm_row(const float* x, const float* gamma, const float* beta, int64_t n, float eps, float* out,
                    float* mean, float* rstd);
void layer_norm_backward_row(const float* dout, const float* x, const float* gamma, float mean, float rstd,
                             int64_t n, float* dx);

// One AdamW update of n elements (the trainer's optimizer), each lane the
// scalar expression with the same roundings (no fused multiply-add), so every
// target gives the same bits:
//   g' = g * gradient_scale;  m = b1 m + (1 - b1) g';  v = b2 v + ((1 - b2) g') g';
//   p = p * decay - (step_size m) / (sqrt(v) v_correction + eps).
struct AdamwStep {
  float beta1, beta2, step_size, v_correction, eps, decay, gradient_scale;
};
void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, const AdamwStep& step);

// bfloat16 / float16 bit patterns to float32 (exact) and back, rounded to
// nearest even as relpos/half.hpp rounds (a NaN stays a NaN; its payload may
// differ between targets).
void widen_bf16(const uint16_t* x, float* y, int64_t n);
void narrow_bf16(const float* x, uint16_t* y, int64_t n);
// x as the sum of three bfloat16 numbers, each part the top 16 bits of the
// rest (truncated, not rounded): hi of x, mid of x - hi, lo of x - hi - mid.
// hi + mid + lo == x exactly for finite x with |x| >= 2^-103 or x == 0 (below
// that a rest is subnormal and loses bits); infinity and NaN give NaN parts
// after hi.
void split_bf16(const float* x, uint16_t* hi, uint16_t* mid, uint16_t* lo, int64_t n);
void widen_f16(const uint16_t* x, float* y, int64_t n);
void narrow_f16(const float* x, uint16_t* y, int64_t n);

// The target the functions above run on now ("AVX2", "AVX3", ...), the
// targets compiled in, and those this CPU supports.
std::string active_target();
std::vector<std::string> compiled_targets();
std::vector<std::string> supported_targets();

// Limits dispatch to targets no better than `name` (as RELPOS_SIMD does);
// "" restores the best. Throws std::invalid_argument for an unknown name.
void limit_targets(const std::string& name);

}  // namespace relpos::simd
