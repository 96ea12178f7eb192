// Which algorithm serves which call, stated here from docs/design.md section 2 and
// the Algorithm enum's comment, independently of the library's
// check_algorithm, and the cases that run every algorithm: problem.hpp's
// generator plus the geometries it lacks, the ones skew and rel-shift need
// (causal self-attention with equal offsets, Transformer-XL memory) and odd
// sizes (L = 1, 7, 97; d = 16, 59).
#pragma once

#include <algorithm>
#include <functional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "problem.hpp"

namespace relpos_test {

using relpos::Algorithm;

inline const std::vector<Algorithm>& every_algorithm() {
  static const std::vector<Algorithm> a = {Algorithm::automatic, Algorithm::reference, Algorithm::split,
                                           Algorithm::gather,    Algorithm::skew,      Algorithm::generalized_skew,
                                           Algorithm::relshift,  Algorithm::fused};
  return a;
}

// The rule: reference and fused serve everything; gather every scheme but
// Transformer-XL, DeBERTa and the schemes on a grid (SAM, Swin); split Shaw;
// skew Shaw under a causal mask with Lq == Lk and equal offsets (key padding
// allowed); generalized skew Shaw and
// Transformer-XL, anything; rel-shift Transformer-XL under a causal mask with
// the queries end-aligned with the keys (k_offset + Lk == q_offset + Lq).
inline bool serves(Algorithm a, const Spec& s) {
  const bool shaw = s.scheme == Scheme::shaw, xl = s.scheme == Scheme::xl;
  switch (a) {
    case Algorithm::automatic:
    case Algorithm::reference:
    case Algorithm::fused:
      return true;
    case Algorithm::gather:
      return !xl && s.scheme != Scheme::deberta && s.scheme != Scheme::sam && s.scheme != Scheme::swin;
    case Algorithm::split:
      return shaw;
    case Algorithm::skew:
      return shaw && s.causal() && s.Lq == s.Lk && s.q_offset == s.k_offset;
    case Algorithm::generalized_skew:
      return shaw || xl;
    case Algorithm::relshift:
      return xl && s.causal() && s.k_offset + s.Lk == s.q_offset + s.Lq;
  }
  return false;
}

// What automatic must resolve to: the fused kernel, for every call (the
// Algorithm enum's comment).
inline Algorithm automatic_choice(const Spec&) { return Algorithm::fused; }

inline Spec with_algorithm(Spec s, Algorithm a) {
  s.algorithm = a;
  s.label += std::string("__") + relpos::to_string(a);
  return s;
}

// ---- the geometries problem.hpp's generator lacks ------------------------------

// Causal self-attention at equal offsets (skew's territory): every Shaw
// variant (K-only, V-only, K+V; shared and per-head tables; beyond clip and
// zero), with and without key padding, at L = 1 (d = 16) and L = 7 (d = 59,
// offsets 3); two of them at L = 97. And one Lq == Lk case with unequal
// offsets, which skew must refuse.
inline std::vector<Spec> causal_self_cases() {
  struct Shape {
    const char* name;
    int64_t B, H, L, d, dv, offset, shaw_k;
  };
  const Shape small[] = {{"L1_d16", 2, 2, 1, 16, 5, 0, 2}, {"L7_d59_off3", 2, 2, 7, 59, 4, 3, 2}};
  const Shape large = {"L97_d16", 1, 1, 97, 16, 7, 0, 5};
  auto make = [](Spec s, MaskKind mask, const Shape& sh) {
    s.mask = mask;
    s.B = sh.B, s.H = sh.H, s.Lq = s.Lk = sh.L, s.d = sh.d, s.dv = sh.dv;
    s.q_offset = s.k_offset = sh.offset;
    s.shaw_k = sh.shaw_k;
    s.label += std::string("__") + (mask == MaskKind::causal ? "causal" : "causal_padding") + "__" + sh.name;
    return s;
  };
  std::vector<Spec> out;
  for (const Spec& variant : scheme_variants()) {
    if (variant.scheme != Scheme::shaw) continue;
    for (MaskKind mask : {MaskKind::causal, MaskKind::causal_padding})
      for (const Shape& sh : small) out.push_back(make(variant, mask, sh));
    if (variant.label == "shaw_kv_shared_clip") out.push_back(make(variant, MaskKind::causal, large));
    if (variant.label == "shaw_kv_per_head_zero") out.push_back(make(variant, MaskKind::causal_padding, large));
  }
  Spec shifted = scheme_variants()[1];  // shaw_kv_shared_clip
  shifted.mask = MaskKind::causal;
  shifted.Lq = shifted.Lk = 5, shifted.q_offset = 2, shifted.k_offset = 0;
  shifted.label += "__causal__self_shifted_offsets";
  out.push_back(shifted);
  return out;
}

// Transformer-XL with memory (keys = [memory; segment], q_offset = mem_len),
// clamp_len 0 and 3, pos_dim != d, under every mask (rel-shift serves the
// causal ones); end-aligned with a nonzero k_offset; more queries than keys
// (the first rows see nothing); L = 1 and L = 97 (clamped) self-attention.
inline std::vector<Spec> xl_memory_cases() {
  std::vector<Spec> out;
  auto xl = [](std::string label, MaskKind mask, int64_t lq, int64_t lk, int64_t q_off, int64_t k_off) {
    Spec s;
    s.scheme = Scheme::xl;
    s.label = std::move(label);
    s.mask = mask;
    s.Lq = lq, s.Lk = lk, s.q_offset = q_off, s.k_offset = k_off;
    s.d = 16, s.dv = 5, s.xl_pos_dim = 6;
    return s;
  };
  for (int64_t clamp : {0, 3})
    for (const NamedMask& m : masks()) {
      Spec s = xl("xl_memory__clamp" + std::to_string(clamp) + "__" + m.name, m.kind, 7, 12, 5, 0);
      s.xl_clamp_len = clamp;
      s.layout = clamp ? Layout::strided : Layout::dense;
      out.push_back(s);
    }
  out.push_back(xl("xl_memory__end_aligned_k_offset4__causal_padding", MaskKind::causal_padding, 3, 8, 9, 4));
  out.push_back(xl("xl_memory__queries_outnumber_keys__causal", MaskKind::causal, 5, 3, 0, 2));
  out.push_back(xl("xl_memory__L1__causal", MaskKind::causal, 1, 1, 0, 0));
  out.push_back(xl("xl_memory__L1__nomask_offset7", MaskKind::none, 1, 1, 7, 7));
  Spec big = xl("xl_memory__L97__causal", MaskKind::causal, 97, 97, 0, 0);
  big.B = 1, big.H = 1, big.xl_clamp_len = 40;
  out.push_back(big);
  return out;
}

// L = 97 for the schemes without relative embeddings, one variant each with
// its own mask: none, T5 (bidirectional, both signs of r), ALiBi (explicit
// slopes), RoPE (interleaved, partial rotation).
inline std::vector<Spec> odd_size_cases() {
  const std::pair<const char*, NamedMask> picks[] = {{"none", masks()[3]},
                                                     {"t5_bidirectional", masks()[2]},
                                                     {"alibi_explicit_slopes", masks()[1]},
                                                     {"rope_interleaved_rot4", masks()[0]}};
  std::vector<Spec> out;
  for (const Spec& variant : scheme_variants())
    for (const auto& [label, mask] : picks) {
      if (variant.label != label) continue;
      Spec s = variant;
      s.mask = mask.kind;
      s.B = 1, s.H = 1, s.Lq = 97, s.Lk = 97, s.d = 16, s.dv = 7;
      s.label = "L97__" + s.label + "__" + mask.name + "_d16";
      out.push_back(s);
    }
  return out;
}

// Dropout on every scheme variant, unmasked and causal with padding, in
// self-attention, against a KV cache (strided) and with the queries before
// the keys; on skew's causal self-attention and on Transformer-XL's memory
// (rel-shift's).
inline std::vector<Spec> dropout_cases() {
  std::vector<Spec> out;
  for (const Spec& variant : scheme_variants())
    for (const NamedMask& m : {masks()[0], masks()[3]})
      for (int g = 0; g < 3; ++g) out.push_back(with_dropout(with_mask_and_geometry(variant, m, geometries()[g])));
  for (const Spec& s : causal_self_cases())
    if (s.label.rfind("shaw_kv_per_head_zero", 0) == 0 || s.label.rfind("shaw_k_only", 0) == 0)
      out.push_back(with_dropout(s));
  for (const Spec& s : xl_memory_cases())
    if (s.Lq < 97) out.push_back(with_dropout(s));
  for (const Spec& s : grid_cases())
    if (s.mask == MaskKind::none || s.mask == MaskKind::causal_padding) out.push_back(with_dropout(s));
  return out;
}

// ---- groups of cases, one test each -------------------------------------------------
// ctest runs every test in a process of its own, which costs more than a small
// case under the sanitizers: the algorithm tests take their cases in groups
// and name the failing case in a trace.

struct CaseGroup {
  std::string label;
  std::vector<Spec> cases;
};
inline void PrintTo(const CaseGroup& g, std::ostream* os) { *os << g.label << " (" << g.cases.size() << " cases)"; }
inline std::string group_name(const ::testing::TestParamInfo<CaseGroup>& info) { return info.param.label; }

// Cases grouped by `key`, groups in order of first appearance.
inline std::vector<CaseGroup> group_by(const std::vector<Spec>& cases,
                                       const std::function<std::string(const Spec&)>& key) {
  std::vector<CaseGroup> groups;
  for (const Spec& s : cases) {
    const std::string k = key(s);
    auto g = std::find_if(groups.begin(), groups.end(), [&](const CaseGroup& x) { return x.label == k; });
    if (g == groups.end())
      groups.push_back({k, {s}});
    else
      g->cases.push_back(s);
  }
  return groups;
}

// The label up to its first "__" (the scheme variant, or xl_memory, L97), plus a suffix.
inline std::function<std::string(const Spec&)> label_prefix(const std::string& suffix) {
  return [suffix](const Spec& s) { return s.label.substr(0, s.label.find("__")) + suffix; };
}

// Every case, the generator's plus the extra geometries, in groups: the
// generator's by scheme variant, the causal self-attention cases by Shaw
// variant, the Transformer-XL memory cases, the L = 97 cases of the other
// schemes, the dropout cases by scheme variant. They run on one thread: an
// OpenMP region per call costs milliseconds when ctest runs two processes on two cores;
// attention/algorithms_test.cpp checks the thread count apart.
inline std::vector<CaseGroup> algorithm_problem_groups() {
  std::vector<CaseGroup> out;
  for (const auto& [cases, suffix] :
       {std::pair{all_cases(), "__generator"}, std::pair{causal_self_cases(), "__causal_self"},
        std::pair{xl_memory_cases(), ""}, std::pair{odd_size_cases(), ""}, std::pair{grid_cases(), "__grid"},
        std::pair{segment_cases(), "__segments"},
        std::pair{dropout_cases(), "__dropout"}})
    for (CaseGroup& g : group_by(cases, label_prefix(suffix))) {
      for (Spec& s : g.cases) s.num_threads = 1;
      out.push_back(std::move(g));
    }
  return out;
}

}  // namespace relpos_test
