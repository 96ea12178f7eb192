// Half-width storage: a call whose tensors are bfloat16 or float16 computes
// in float32 (FlashAttention's convention) and rounds each result once into
// the caller's tensors.
//
// The fused kernel reads the call's rows itself: it widens each head's rows
// into the per-thread head copies it makes anyway and rounds as it stores,
// so a half call needs no more scratch than a float32 one. Every other
// algorithm (and the fused grouped-query backward) runs its float32
// implementation on float32 copies of a chunk of batch rows at a time:
// O(rows H L d) floats, bounded by kChunkBytes or one batch row, next to
// those algorithms' O(L^2) scratch. Either way every algorithm serves the
// half types exactly as it serves float32.
//
// Positional tables are small: they are widened once per call, and their
// gradients accumulate in float32 over all chunks before the one rounding.
// Gradients are "added into" the caller's tensors as in float32: the sum
// old + gradient is formed in float32 and rounded once.
#include "half_storage.hpp"

#include <algorithm>
#include <cstring>
#include <deque>

#include "../backend/convert.hpp"
#include "../backend/scratch.hpp"
#include "../schemes/registry.hpp"
#include "fused.hpp"

namespace relpos::half_storage {
namespace {

// to[...] = from[...] converted, over two views of one shape.
template <class From, class To, std::size_t N>
void copy_elements(const View<From, N>& from, const View<To, N>& to) {
  int64_t outer = 1;
  for (std::size_t a = 0; a + 1 < N; ++a) outer *= from.shape[a];
  for (int64_t o = 0; o < outer; ++o) {
    int64_t rest = o, fo = 0, to_offset = 0;
    for (std::size_t a = N - 1; a-- > 0;) {
      const int64_t index = rest % from.shape[a];
      rest /= from.shape[a];
      fo += index * from.stride[a], to_offset += index * to.stride[a];
    }
    convert::row(from.data + fo, from.stride[N - 1], to.data + to_offset, to.stride[N - 1], from.shape[N - 1]);
  }
}

// A dense float32 copy of `from` in `storage` (empty stays empty).
template <class S, std::size_t N>
View<float, N> widen(const View<const S, N>& from, Scratch<float>& storage) {
  if (from.empty()) return {};
  storage.resize(from.numel());
  const View<float, N> to = View<float, N>::contiguous(storage.data(), from.shape);
  copy_elements(from, to);
  return to;
}

template <class S, std::size_t N>
void narrow(const View<float, N>& from, const View<S, N>& to) {
  if (!to.empty()) copy_elements(View<const float, N>(from), to);
}

// Batch rows [b0, b0 + n) of a view whose first dimension is the batch.
template <class T, std::size_t N>
View<T, N> rows(View<T, N> v, int64_t b0, int64_t n) {
  if (v.empty()) return v;
  v.data += b0 * v.stride[0];
  v.shape[0] = n;
  return v;
}

// The call's positional parameters in float32: the options as given (each
// scheme's for_each_option), every learnable table widened (owned here).
template <class S>
struct WideParams {
  PositionParams<float> pos;
  std::deque<Scratch<float>> storage;  // one per table; a deque keeps them in place

  explicit WideParams(const PositionParams<S>& from) {
    copy_scheme_options(from, pos);
    for_each_scheme_param(pos, [&](const char* name, auto& to) {
      for_each_scheme_param(from, [&](const char* other, const auto& given) {
        if constexpr (std::tuple_size_v<decltype(to.shape)> == std::tuple_size_v<decltype(given.shape)>)
          if (std::strcmp(name, other) == 0) to = widen(given, storage.emplace_back());
      });
    });
  }
};

// The wanted parameter gradients in float32, starting from the caller's
// values; written back (rounded once) by finish().
template <class S>
struct WideGrads {
  PositionGrads<float> grads;
  std::deque<Scratch<float>> storage;
  const PositionGrads<S>& into;

  WideGrads(const PositionParams<S>& pos, const PositionGrads<S>& g) : into(g) {
    for_each_scheme_param(pos, [&](const char*, const auto&, const auto& given, auto& wide) {
      wide = widen(View<const S, std::tuple_size_v<decltype(given.shape)>>(given), storage.emplace_back());
    }, g, grads);
  }
  void finish() const {
    PositionParams<S> none;
    for_each_scheme_param(none, [&](const char*, const auto&, const auto& wide, const auto& given) {
      narrow(wide, given);
    }, grads, into);
  }
};

// Bytes of float32 copies per batch row: q, out, dout, dq and k, v, dk, dv.
template <class S>
double row_bytes(const AttentionForward<S>& p) {
  const double H = double(p.q.shape[1]), Hkv = double(p.k.shape[1]), Lq = double(p.q.shape[2]),
               Lk = double(p.k.shape[2]), d = double(p.q.shape[3]), dv = double(p.v.shape[3]);
  return 4.0 * (H * Lq + Hkv * Lk) * (2.0 * d + 2.0 * dv);
}

// Batch rows per chunk: as many as fit `budget` bytes of float32 copies, at least one.
template <class S>
int64_t chunk_rows(const AttentionForward<S>& p, double budget) {
  return std::clamp<int64_t>(int64_t(budget / row_bytes(p)), 1, p.q.shape[0]);
}

// The call's float32 twin: every option, shape and stride as given, the
// positional parameters `pos`, no tensor data (views of null data).
template <class S>
AttentionForward<float> twin(const AttentionForward<S>& p, const PositionParams<float>& pos) {
  const auto shape_only = [](const auto& v) {
    using V = View<float, std::tuple_size_v<decltype(v.shape)>>;
    return V{nullptr, v.shape, v.stride};
  };
  AttentionForward<float> f;
  f.q = shape_only(p.q), f.k = shape_only(p.k), f.v = shape_only(p.v), f.out = shape_only(p.out);
  f.lse = p.lse;  // float32 already
  f.causal = p.causal;
  f.key_padding = p.key_padding;
  f.q_segments = p.q_segments, f.k_segments = p.k_segments;
  f.q_offset = p.q_offset, f.k_offset = p.k_offset;
  f.scale = p.scale;
  f.pos = pos;
  f.dropout = p.dropout;
  f.algorithm = p.algorithm;
  f.num_threads = p.num_threads;
  return f;
}

template <class S>
AttentionBackward<float> twin(const AttentionBackward<S>& p, const PositionParams<float>& pos,
                              const PositionGrads<float>& dpos) {
  AttentionBackward<float> f;
  static_cast<AttentionForward<float>&>(f) = twin(static_cast<const AttentionForward<S>&>(p), pos);
  f.dout = {nullptr, p.dout.shape, p.dout.stride};
  f.key_grads_from = p.key_grads_from;
  f.dpos = dpos;
  return f;
}

// The float32 call of batch rows [b0, b0 + n): the twin with the rows'
// inputs widened into `buffers` and an output buffer.
template <class S>
AttentionForward<float> chunk_call(const AttentionForward<S>& p, const PositionParams<float>& pos, int64_t b0,
                                   int64_t n, Scratch<float>* buffers) {
  AttentionForward<float> f = twin(p, pos);
  f.q = widen(rows(p.q, b0, n), buffers[0]);
  f.k = widen(rows(p.k, b0, n), buffers[1]);
  f.v = widen(rows(p.v, b0, n), buffers[2]);
  auto out_shape = p.out.shape;
  out_shape[0] = n;
  buffers[3].resize(n * p.out.shape[1] * p.out.shape[2] * p.out.shape[3]);
  f.out = View4<float>::contiguous(buffers[3].data(), out_shape);
  f.lse = rows(p.lse, b0, n);
  f.key_padding = rows(p.key_padding, b0, n);
  f.q_segments = rows(p.q_segments, b0, n), f.k_segments = rows(p.k_segments, b0, n);
  f.dropout.batch_offset += b0;  // the mask of the call's batch rows, not the chunk's
  return f;
}

// Whether the fused kernel reads the call's rows itself (no chunk copies):
// every fused call but a grouped-query backward, whose per-query-head key
// gradients dispatch sums in the storage type.
template <class S>
bool fused_reads_in_place(const AttentionForward<S>& p, bool backward) {
  return resolve_algorithm(p) == Algorithm::fused && !(backward && p.k.shape[1] != p.q.shape[1]);
}

}  // namespace

template <class S>
double chunk_bytes(const AttentionForward<S>& p) {
  if (fused_reads_in_place(p, /*backward=*/false) && fused_reads_in_place(p, true)) return 0;
  return row_bytes(p) * double(chunk_rows(p, kChunkBytes));
}

template <class S>
void forward(const AttentionForward<S>& p, double budget) {
  const WideParams<S> wide(p.pos);
  if (fused_reads_in_place(p, /*backward=*/false)) return fused::forward_stored(twin(p, wide.pos), p);
  const int64_t B = p.q.shape[0], n = chunk_rows(p, budget);
  Scratch<float> buffers[4];
  for (int64_t b0 = 0; b0 < B; b0 += n) {
    const int64_t count = std::min(n, B - b0);
    const AttentionForward<float> f = chunk_call(p, wide.pos, b0, count, buffers);
    forward_chunk(f);
    narrow(f.out, rows(p.out, b0, count));
  }
}

template <class S>
void backward(const AttentionBackward<S>& p, double budget) {
  const WideParams<S> wide(p.pos);
  const WideGrads<S> grads(p.pos, p.dpos);
  if (fused_reads_in_place(p, /*backward=*/true)) {
    fused::backward_stored(twin(p, wide.pos, grads.grads), p);
    return grads.finish();
  }
  const int64_t B = p.q.shape[0], n = chunk_rows(p, budget);
  Scratch<float> buffers[8];
  for (int64_t b0 = 0; b0 < B; b0 += n) {
    const int64_t count = std::min(n, B - b0);
    AttentionBackward<float> f;
    static_cast<AttentionForward<float>&>(f) = chunk_call(p, wide.pos, b0, count, buffers);
    // out is an input of the backward: widen it over the forward's buffer.
    f.out = widen(rows(View4<const S>(p.out), b0, count), buffers[3]);
    f.dout = widen(rows(p.dout, b0, count), buffers[4]);
    f.dq = widen(rows(View4<const S>(p.dq), b0, count), buffers[5]);
    f.dk = widen(rows(View4<const S>(p.dk), b0, count), buffers[6]);
    f.dv = widen(rows(View4<const S>(p.dv), b0, count), buffers[7]);
    f.key_grads_from = p.key_grads_from;
    f.dpos = grads.grads;
    attention_backward(f);
    narrow(f.dq, rows(p.dq, b0, count));
    narrow(f.dk, rows(p.dk, b0, count));
    narrow(f.dv, rows(p.dv, b0, count));
  }
  grads.finish();
}

template void forward<bfloat16>(const AttentionForward<bfloat16>&, double);
template void forward<float16>(const AttentionForward<float16>&, double);
template void backward<bfloat16>(const AttentionBackward<bfloat16>&, double);
template void backward<float16>(const AttentionBackward<float16>&, double);
template double chunk_bytes<bfloat16>(const AttentionForward<bfloat16>&);
template double chunk_bytes<float16>(const AttentionForward<float16>&);

}  // namespace relpos::half_storage
