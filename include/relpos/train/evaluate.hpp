// Bits per byte of a model on held-out bytes, at any evaluation length.
//
// A window of length n covers bytes [start, start + n + 1): it predicts bytes
// start+1 .. start+n, each from the bytes before it inside the window, and
// scores the predictions from `first_scored` on. Two ways to tile the data:
//   non-overlapping: windows at 0, n, 2n, ... (consecutive windows share the
//     one boundary byte that the first predicts last and the second reads
//     first); every prediction scored. Early bytes of a window see little
//     context.
//   sliding: windows at 0, s, 2s, ... (stride s); the first window scores all n
//     predictions, every later one only its last s (the new tail), so each
//     byte is scored once and, after the first window, with at least n - s
//     bytes of context. Costs n / s times the non-overlapping evaluation.
// Bytes after the last whole window are not scored; both tilings report how
// many bytes they scored.
//
// Transformer-XL can also be evaluated the way its paper does at a longer
// length: segments of the training length read in order, each attending to a
// memory of the previous keys and values. With segment L and memory (n-1) L a
// prediction sees up to n L bytes, as a window of n L would give it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "relpos/nn/model.hpp"

namespace relpos::train {

struct Window {
  int64_t start = 0;
  int first_scored = 0;  // predictions before this index in the window are context only
};

std::vector<Window> nonoverlapping_windows(int64_t bytes, int length);
std::vector<Window> sliding_windows(int64_t bytes, int length, int stride);  // 1 <= stride <= length

struct Score {
  double bits_per_byte = 0;
  int64_t bytes_scored = 0;
};

// Scores `windows` of `length` over data, `batch` windows per forward pass.
// Throws std::invalid_argument if a window runs past the data or the list is empty.
Score evaluate_windows(nn::Model& model, std::span<const uint8_t> data, int length, const std::vector<Window>& windows,
                       int batch);

// Transformer-XL memory evaluation: the data cut into `batch` equal streams,
// each read in consecutive segments of `segment` predictions with a memory
// of `memory` positions (0 = none). Every prediction is scored.
Score evaluate_with_memory(nn::Model& model, std::span<const uint8_t> data, int segment, int memory, int batch);

}  // namespace relpos::train
