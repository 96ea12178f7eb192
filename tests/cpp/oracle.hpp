// An independent restatement of docs/design.md section 1 for double problems
// (dropout's mask: dropout_oracle.hpp),
// written from the formulas, not from the library: it shares no code with
// src/ (no shaw_index, t5_bucket, alibi_slopes, rope_rotate or sinusoid), and
// computes the softmax directly, one (b, h, i) row at a time.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "dropout_oracle.hpp"
#include "problem.hpp"

namespace relpos_test::oracle {

inline int64_t distance(const Spec& s, int64_t i, int64_t j) { return (s.k_offset + j) - (s.q_offset + i); }

inline bool masked(const Spec& s, int64_t b, int64_t i, int64_t j) {
  return (s.causal() && distance(s, i, j) > 0) || s.padded(b, j) ||
         (s.segment_length > 0 && s.segment(b, s.q_offset + i) != s.segment(b, s.k_offset + j));
}

// Shaw row of distance r, or -1 for "no embedding" (beyond = zero, |r| > k).
inline int64_t shaw_row(const Spec& s, int64_t r) {
  if (std::abs(r) > s.shaw_k && s.shaw_beyond == Beyond::zero) return -1;
  return std::max(-s.shaw_k, std::min(s.shaw_k, r)) + s.shaw_k;
}

// The HF T5 bucket in exact (double) arithmetic. The test problems use
// parameters whose bucket edges are not within float rounding of an integer,
// so this equals the float32 formula there.
inline int64_t t5_bucket_exact(int64_t r, bool bidirectional, int64_t num_buckets, int64_t max_distance) {
  int64_t base = 0, n = 0;
  if (bidirectional) {
    num_buckets /= 2;
    base = r > 0 ? num_buckets : 0;
    n = std::abs(r);
  } else {
    n = std::max<int64_t>(-r, 0);
  }
  const int64_t exact = num_buckets / 2;
  if (n < exact) return base + n;
  const double f = std::log(double(n) / exact) / std::log(double(max_distance) / exact) * (num_buckets - exact);
  return base + std::min<int64_t>(exact + int64_t(std::floor(f)), num_buckets - 1);
}

// transformers' make_log_bucket_position for relative position x = query -
// key, its float32 steps written out, then the table row clamp(bucket + span).
inline int64_t deberta_row_exact(const Spec& s, int64_t x) {
  const int64_t span = s.deberta_span(), mid = s.deberta_position_buckets / 2;
  int64_t bucket = x;
  if (s.deberta_position_buckets > 0 && std::abs(x) > mid) {
    const float ratio = float(double(s.deberta_max_relative_positions - 1) / double(mid));
    const float f = float(std::log(double(float(std::abs(x)) / float(mid)))) / float(std::log(double(ratio))) *
                    float(mid - 1);
    bucket = (int64_t(std::ceil(f)) + mid) * (x < 0 ? -1 : 1);
  }
  return std::clamp<int64_t>(bucket + span, 0, 2 * span - 1);
}

// Press et al.'s get_slopes, transliterated from the paper's Python.
inline std::vector<double> paper_alibi_slopes(int64_t n) {
  auto power_of_2 = [](int64_t m) {
    std::vector<double> s;
    const double start = std::pow(2.0, -std::pow(2.0, -(std::log2(double(m)) - 3)));
    for (int64_t i = 0; i < m; ++i) s.push_back(std::pow(start, double(i + 1)));
    return s;
  };
  if (std::log2(double(n)) == std::floor(std::log2(double(n)))) return power_of_2(n);
  const int64_t closest = int64_t(1) << int64_t(std::floor(std::log2(double(n))));
  std::vector<double> s = power_of_2(closest);
  const std::vector<double> more = paper_alibi_slopes(2 * closest);
  for (std::size_t i = 0; s.size() < std::size_t(n); i += 2) s.push_back(more[i]);
  return s;
}

// x rotated by RoPE at absolute position pos (the rotary dims only).
inline std::vector<double> rope_rotated(const Spec& s, std::vector<double> x, double pos) {
  const int64_t dims = s.rope.rotary_dims ? s.rope.rotary_dims : s.d;
  const std::vector<double> x0 = x;
  for (int64_t f = 0; f < dims / 2; ++f) {
    const double angle = pos * std::pow(s.rope.base, -2.0 * f / dims);
    const int64_t a = s.rope.style == RopeStyle::half_split ? f : 2 * f;
    const int64_t b = s.rope.style == RopeStyle::half_split ? f + dims / 2 : 2 * f + 1;
    x[a] = x0[a] * std::cos(angle) - x0[b] * std::sin(angle);
    x[b] = x0[b] * std::cos(angle) + x0[a] * std::sin(angle);
  }
  return x;
}

// Transformer-XL's R(p) = [sin(p f_0..), cos(p f_0..)], f_i = 10000^(-2i/dim).
inline std::vector<double> xl_embedding(double p, int64_t dim) {
  std::vector<double> e(dim);
  for (int64_t i = 0; i < dim / 2; ++i) {
    e[i] = std::sin(p * std::pow(10000.0, -2.0 * i / dim));
    e[dim / 2 + i] = std::cos(p * std::pow(10000.0, -2.0 * i / dim));
  }
  return e;
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t x = 0; x < a.size(); ++x) s += a[x] * b[x];
  return s;
}

// SAM's get_rel_pos (transformers' SamVisionAttention) for one pair of
// coordinates: the shorter axis's coordinates scaled, in float32 (the default
// dtype the coordinates take), the index truncated as .long() does.
inline int64_t sam_rel_index(int64_t q, int64_t k, int64_t q_size, int64_t k_size) {
  const float q_coords = float(q) * float(std::max(double(k_size) / double(q_size), 1.0));
  const float k_coords = float(k) * float(std::max(double(q_size) / double(k_size), 1.0));
  return int64_t((q_coords - k_coords) + float(double(k_size - 1) * std::max(double(q_size) / double(k_size), 1.0)));
}

inline std::vector<double> row(Tensor<double, 4>& t, int64_t b, int64_t h, int64_t i) {
  std::vector<double> r(t.shape()[3]);
  for (int64_t x = 0; x < t.shape()[3]; ++x) r[x] = t(b, h, i, x);
  return r;
}

// What a scheme adds to the logit scale * q_i . k_j (T5 / ALiBi / KERPLE biases, Shaw's
// and Transformer-XL's scaled score terms). Not used for RoPE.
inline double extra_logit(Problem<double>& p, int64_t b, int64_t h, int64_t i, int64_t j) {
  const Spec& s = p.spec;
  const int64_t r = distance(s, i, j);
  const std::vector<double> q = row(p.q, b, h, i);
  switch (s.scheme) {
    case Scheme::shaw: {
      const int64_t c = shaw_row(s, r);
      if (!s.has_wk() || c < 0) return 0;
      double sc = 0;
      for (int64_t x = 0; x < s.d; ++x) sc += q[x] * p.shaw_wk(s.shaw_wk_per_head ? h : 0, c, x);
      return p.scale() * sc;
    }
    case Scheme::t5:
      return p.t5_table(h, t5_bucket_exact(r, s.t5_bidirectional, s.t5_num_buckets, s.t5_max_distance));
    case Scheme::alibi: {
      const double m = s.alibi_explicit_slopes ? p.alibi_slopes(h) : paper_alibi_slopes(s.H)[h];
      return -m * double(std::abs(r));
    }
    case Scheme::kerple:
      return -p.kerple_r1(h) * std::log(1.0 + p.kerple_r2(h) * double(std::abs(r)));
    case Scheme::kerple_power:
      return -p.kerple_power_r1(h) * std::pow(double(std::abs(r)), p.kerple_power_r2(h));
    case Scheme::xl: {
      int64_t dist = -r;
      if (s.xl_clamp_len > 0) dist = std::max(-s.xl_clamp_len, std::min(s.xl_clamp_len, dist));
      const std::vector<double> e = xl_embedding(double(dist), s.xl_pos_dim);
      const std::vector<double> k = row(p.k, b, h, j);
      double sc = 0;
      for (int64_t x = 0; x < s.d; ++x) {
        double wr = 0;
        for (int64_t f = 0; f < s.xl_pos_dim; ++f) wr += p.xl_w_r(h, x, f) * e[f];
        sc += p.xl_u(h, x) * k[x] + (q[x] + p.xl_v(h, x)) * wr;
      }
      return p.scale() * sc;
    }
    case Scheme::sam: {  // unscaled, as SAM adds it to the scaled q . k
      const int64_t kh = s.key_grid_h(), kw = s.key_grid_w();
      const int64_t y = sam_rel_index(i / s.grid_qw, j / kw, s.grid_qh, kh);
      const int64_t x = sam_rel_index(i % s.grid_qw, j % kw, s.grid_qw, kw);
      double sc = 0;
      for (int64_t c = 0; c < s.d; ++c) sc += q[c] * (p.sam_rel_h(y, c) + p.sam_rel_w(x, c));
      return sc;
    }
    case Scheme::swin: {  // Swin's relative_position_index: query cell minus key cell, shifted to >= 0
      const int64_t wh = s.grid_qh, ww = s.grid_qw;
      const int64_t dy = i / ww - j / ww + wh - 1, dx = i % ww - j % ww + ww - 1;
      return p.swin_table(h, dy * (2 * ww - 1) + dx);
    }
    case Scheme::deberta: {  // both terms at transformers' relative position query - key = -r
      const std::vector<double> k = row(p.k, b, h, j);
      const int64_t ht = s.deberta_per_head ? h : 0, c2p = deberta_row_exact(s, -r), p2c = c2p;
      double sc = 0;
      for (int64_t x = 0; x < s.d; ++x) {
        if (s.deberta_c2p) sc += q[x] * p.deberta_c2p(ht, c2p, x);
        if (s.deberta_p2c) sc += k[x] * p.deberta_p2c(ht, p2c, x);
      }
      return p.scale() * sc;
    }
    default:
      return 0;
  }
}

// The full logit of (b, h, i, j), before masking.
inline double logit(Problem<double>& p, int64_t b, int64_t h, int64_t i, int64_t j) {
  const Spec& s = p.spec;
  std::vector<double> q = row(p.q, b, h, i), k = row(p.k, b, h, j);
  if (s.scheme == Scheme::rope) {
    q = rope_rotated(s, q, double(s.q_offset + i));
    k = rope_rotated(s, k, double(s.k_offset + j));
  }
  return p.scale() * dot(q, k) + extra_logit(p, b, h, i, j);
}

// Shaw's value term wv[c(r)][x] (zero for other schemes).
inline double extra_value(Problem<double>& p, int64_t h, int64_t i, int64_t j, int64_t x) {
  const Spec& s = p.spec;
  if (!s.has_wv()) return 0;
  const int64_t c = shaw_row(s, distance(s, i, j));
  return c < 0 ? 0 : p.shaw_wv(s.shaw_wv_per_head ? h : 0, c, x);
}

struct Result {
  std::vector<double> out, lse;  // logical row-major order, like Tensor::values()
};

inline Result attention(Problem<double>& p) {
  const Spec& s = p.spec;
  Result res;
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t i = 0; i < s.Lq; ++i) {
        std::vector<double> w(s.Lk, 0.0);
        double total = 0;
        for (int64_t j = 0; j < s.Lk; ++j) {
          if (masked(s, b, i, j)) continue;
          w[j] = std::exp(logit(p, b, h, i, j));  // the test logits are small: no max shift needed
          total += w[j];
        }
        res.lse.push_back(total > 0 ? std::log(total) : -std::numeric_limits<double>::infinity());
        for (int64_t x = 0; x < s.dv; ++x) {
          double o = 0;
          for (int64_t j = 0; j < s.Lk; ++j)
            if (w[j] > 0)
              o += w[j] / total * dropout_factor(s, b, h, i, j) * (p.v(b, h, j, x) + extra_value(p, h, i, j, x));
          res.out.push_back(o);
        }
      }
  return res;
}

// The same problem as plain attention (scheme none): q and k grow by Lk
// features, q_i's feature d + j holding extra_logit(i, j) / scale and k_j's a
// one-hot 1 at d + j, so that scale * q'_i . k'_j = scale * q_i . k_j + extra_logit.
// v and dout are copied.
inline Problem<double> folded_into_none(Problem<double>& p) {
  Spec s = p.spec;
  s.scheme = Scheme::none;
  s.d = p.spec.d + p.spec.Lk;
  s.scale = p.scale();
  Problem<double> f(s);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h) {
      for (int64_t i = 0; i < s.Lq; ++i) {
        for (int64_t x = 0; x < p.spec.d; ++x) f.q(b, h, i, x) = p.q(b, h, i, x);
        for (int64_t x = 0; x < s.dv; ++x) f.dout(b, h, i, x) = p.dout(b, h, i, x);
        for (int64_t j = 0; j < s.Lk; ++j) f.q(b, h, i, p.spec.d + j) = extra_logit(p, b, h, i, j) / p.scale();
      }
      for (int64_t j = 0; j < s.Lk; ++j) {
        for (int64_t x = 0; x < p.spec.d; ++x) f.k(b, h, j, x) = p.k(b, h, j, x);
        for (int64_t jj = 0; jj < s.Lk; ++jj) f.k(b, h, j, p.spec.d + jj) = j == jj ? 1.0 : 0.0;
        for (int64_t x = 0; x < s.dv; ++x) f.v(b, h, j, x) = p.v(b, h, j, x);
      }
    }
  return f;
}

}  // namespace relpos_test::oracle
