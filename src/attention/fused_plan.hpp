// The fused kernel's scratch, planned before any work: every buffer a call's
// forward or backward holds, sized from the call's shapes and the tile
// constants (tiles.hpp) by the functions the kernel's loops call
// (visited_keys, forward_key_block, cut_of, KeyBand::width_of and cut_of,
// group_keys). The kernel takes its forward tiles, key groups and thread
// counts from the plan (tiles, groups, *_threads; backward_key_groups decides
// the groups). Each worker reserves its buffers from the
// plan when it starts and the kernel's loops only fill them, so the plan is
// what the kernel allocates: the scratch test checks each pass byte for byte
// against the library's counters, and the scratch estimate that validation
// refuses calls by is the larger pass. (A backward of more than 65,536 key
// groups by query tiles takes a few bounds instead of walking them all,
// fused_plan.cpp's kPairsWalked: at most a band's tile of rows and a
// staircase operand more than its loops use.)
//
// A buffer's plan is the most any of the call's tiles or heads uses of it;
// the small ones a causal staircase may use (simd::kStaircaseMaxSize wide)
// and those of the bfloat16 split are planned at their largest wherever the
// call can use them. Not planned: a head's copies of keys that it reads in
// place until a padded key turns out to hold a non-finite value
// (zero_padded_keys: the data decides), and per-head vectors that do not grow
// with the lengths (ALiBi's paper slopes, Transformer-XL's dense W_R and its
// gradient, a query bias's column sums), which are not counted either; nor is
// the GEMMs' own working memory (oneDNN's, the float64 loop's transposed copy).
#pragma once

#include <cstdint>

#include "relpos/attention.hpp"
#include "tiles.hpp"

namespace relpos::fused {

// One head's prepared inputs (HeadData, HeadContext), in elements of the
// compute type but scheme_bytes.
struct HeadPlan {
  int64_t qc = 0, qp = 0, k = 0, v = 0, bias = 0;  // HeadData: queries, queries with a bias, key and value copies
  int64_t wk = 0, wv = 0, c2p = 0, p2c = 0, Rk = 0;  // HeadContext: table slices, the keys' p2c scores
  int64_t grid = 0;  // a grid bias's values of a head, or grid tables
  int64_t scheme_bytes = 0;  // the scheme's per-worker objects: RoPE's angles, T5's bucket per distance

  int64_t elements() const { return qc + qp + k + v + bias + wk + wv + c2p + p2c + Rk + grid; }
};

// A forward worker (fused_forward.cpp's ForwardScratch).
struct ForwardPlan {
  HeadPlan head;
  int64_t S = 0, O = 0, Rq = 0, Pb = 0, transposed = 0, diagonals = 0;
  int64_t softmax_rows = 0;  // the online softmax's running maximum and sum, each
  int64_t band = 0;          // a key band's scores
  int64_t split = 0;         // P's bfloat16 parts, where the head splits it

  int64_t elements() const {
    return head.elements() + S + O + Rq + Pb + transposed + diagonals + 2 * softmax_rows + band;
  }
};

// The query-side gradients of one head's key group (fused_backward.cpp's QueryGrads).
struct QueryGradsPlan {
  int64_t dqc = 0, dqp = 0, dR = 0, Pb = 0, dE = 0, dRk = 0, dbias = 0, dgrid = 0;

  int64_t elements() const { return dqc + dqp + dR + Pb + dE + dRk + dbias + dgrid; }
};

// The bfloat16 split of the backward's products (bf16_split.hpp's SplitBackward).
struct SplitBackwardPlan {
  int64_t tile = 0;                  // P's and dS's parts, each (bfloat16)
  int64_t qT3 = 0, doutT3 = 0, k3 = 0;  // the query tile's rows and the group's keys thrice (bfloat16)
  int64_t dkT = 0, dvT = 0;          // the group's dk^T and dv^T (float32)

  int64_t bytes() const {
    return int64_t(sizeof(bfloat16)) * (2 * tile + qT3 + doutT3 + k3) + int64_t(sizeof(float)) * (dkT + dvT);
  }
};

// A backward worker (fused_backward.cpp's BackwardScratch).
struct BackwardPlan {
  HeadPlan head;
  int64_t dout = 0, out_row = 0, D = 0, P = 0, dP = 0, Rq = 0, G = 0, transposed = 0, diagonals = 0;
  int64_t Z = 0, Pz = 0;  // dropout: a tile's multipliers z and P z
  int64_t band = 0;    // a key band's scores, and as many of their gradients (dband)
  int64_t dtable = 0;  // a table's gradient of the head before it is added
  QueryGradsPlan query;        // the worker's own where a head is one key group; else empty
  int64_t dk = 0, dv = 0;      // likewise, where keys_in_place is not
  SplitBackwardPlan split;
  bool positional_queries = false;  // a term reads q + v: each key group keeps dL/d(q + v)
  bool keys_in_place = false;       // dk and dv summed in the caller's tensors (key_grads_in_place)

  int64_t elements() const {
    return head.elements() + dout + out_row + D + P + dP + Z + Pz + Rq + G + transposed + diagonals + 2 * band + dtable +
           query.elements() + dk + dv;
  }
};

struct FusedPlan {
  int64_t compute_bytes = 0;  // of an element of the compute type
  tiles::ForwardTiles tiles;  // the forward's query rows and keys per step
  int forward_threads = 1;    // workers of the forward
  int backward_threads = 1;   // workers of the backward's key groups
  int finishing_threads = 1;  // threads that finish heads (per-thread gradient partials)
  int64_t groups = 1, heads = 0;  // key groups per head; batch x heads
  ForwardPlan forward;
  BackwardPlan backward;
  int64_t group_elements = 0;  // where a head has several key groups: their query-side gradients, all groups'
  int64_t key_grads = 0;       // and each head's dk and dv
  int64_t band_row_sums = 0;  // per finishing thread: a key band's row gradients summed over the batch
  int64_t partials = 0;       // per finishing thread: the positional parameters' gradients
  int64_t call_bytes = 0;     // per call: a key band's rows, Transformer-XL's sinusoids, the indexed tables' rows
  int64_t wide_params_bytes = 0, wide_grads_bytes = 0;  // half storage: parameters and gradients in float32

  double forward_bytes() const;
  double backward_bytes() const;
};

// The plan of call p (stored in S) with the parameter gradients dpos
// wanted (null: every parameter's, the most a backward can need) for the
// backward call `backward`, whose dout it may read and whose dk, dv it may
// sum into in place (null: a worker's copy of dout and dk, dv in scratch,
// the most).
template <class S>
FusedPlan plan(const AttentionForward<S>& p, const PositionGrads<S>* dpos = nullptr,
               const AttentionBackward<S>* backward = nullptr);

}  // namespace relpos::fused
