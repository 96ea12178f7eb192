// The products of float32 tiles split into three bfloat16 parts
// (src/attention/bf16_split.hpp) against double-precision sums of the same
// products. The bfloat16 error rule of the attention tests cannot see the
// third part (its bits lie below a bfloat16 result's rounding), so these
// tiles pair entries that agree in all but their last 8 significant bits
// and multiply them by +1 and -1: their difference, which sums exactly in
// float32 in any order, is carried by the third part alone. Where the CPU
// has AVX512-BF16 the products run oneDNN's bfloat16 matmul; elsewhere the
// widening path of relpos::gemm_bf16.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "../../../src/attention/bf16_split.hpp"

namespace {

using relpos::bfloat16;
using relpos::SplitBackward;
using relpos::SplitTile;

// rows x cols floats in [0.25, 1) (a softmax's P, or dS) whose entries share
// their top 16 bits and differ in the last 8 (low bytes far apart).
std::vector<float> paired_tile(int64_t rows, int64_t cols, std::mt19937& rng) {
  const float base = std::uniform_real_distribution<float>(0.25f, 1.0f)(rng);
  const uint32_t top = std::bit_cast<uint32_t>(base) & 0xffffff00u;
  const uint32_t low[] = {0x00, 0xff, 0x80, 0x3c, 0xc3, 0x11, 0xee, 0x5a};
  std::vector<float> x(rows * cols);
  for (std::size_t n = 0; n < x.size(); ++n) x[n] = std::bit_cast<float>(top | low[(n * 5 + rng() % 3) % 8]);
  return x;
}

// rows x cols bfloat16 of +1 and -1: column c of row r is -1 when r + c is odd.
std::vector<bfloat16> signs(int64_t rows, int64_t cols) {
  std::vector<bfloat16> x(rows * cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) x[r * cols + c] = bfloat16((r + c) % 2 ? -1.0f : 1.0f);
  return x;
}

// got == the double sum within a few float32 roundings of the sum of its
// terms' magnitudes (the paired sums are exact; the others round).
void expect_sum(double got, double sum, double magnitude, const char* what, int64_t i, int64_t j) {
  EXPECT_LE(std::abs(got - sum), 0x1p-22 * magnitude) << what << "(" << i << ", " << j << ")";
}

TEST(SplitProducts, StackedTileTimesValuesCarriesEveryBit) {
  std::mt19937 rng(3);
  const int64_t bq = 4, bk = 6, dv = 3;
  const std::vector<float> P = paired_tile(bq, bk, rng);
  const std::vector<bfloat16> v = signs(bk, dv);
  SplitTile split;
  split.reshape(bq, bk, SplitTile::Layout::stacked);
  for (int64_t i = 0; i < bq; ++i) split.split_row(i, &P[i * bk]);
  std::vector<float> O(bq * dv, 0.5f);
  split.accumulate_times(dv, v.data(), dv, 2.0f, O.data(), dv);
  for (int64_t i = 0; i < bq; ++i)
    for (int64_t x = 0; x < dv; ++x) {
      double sum = 0.5, magnitude = 0.5;
      for (int64_t j = 0; j < bk; ++j) {
        sum += 2.0 * P[i * bk + j] * float(v[j * dv + x]);
        magnitude += 2.0 * P[i * bk + j];
      }
      expect_sum(O[i * dv + x], sum, magnitude, "O", i, x);
    }
}

// Two key tiles (of block = 4 keys and the rest, 3) of one group, each
// against the same query tile: dq, and dk, dv through finish_group.
TEST(SplitProducts, BackwardProductsOfInterleavedTilesCarryEveryBit) {
  std::mt19937 rng(5);
  const int64_t bq = 4, block = 4, keys = 7, d = 3, dv = 2;
  const float scale = 0.5f;
  const std::vector<bfloat16> q = signs(bq, d), dout = signs(bq, dv), k = signs(keys, d);
  SplitBackward split;
  split.start_group(keys, block, k.data(), d, d, dv);
  split.start_query_tile(q.data(), d, dout.data(), dv, bq);
  std::vector<float> dq(bq * d, 0.0f), dk(keys * d, 0.0f), dv_sum(keys * dv, 0.0f);
  std::vector<std::vector<float>> P, dS;
  for (int64_t key = 0; key < keys; key += block) {
    const int64_t bk = std::min(block, keys - key);
    P.push_back(paired_tile(bq, bk, rng)), dS.push_back(paired_tile(bq, bk, rng));
    split.P.reshape(bq, bk, SplitTile::Layout::interleaved);
    split.dS.reshape(bq, bk, SplitTile::Layout::interleaved);
    for (int64_t i = 0; i < bq; ++i) split.P.split_row(i, &P.back()[i * bk]), split.dS.split_row(i, &dS.back()[i * bk]);
    split.tile_products(key, bk, scale, dq.data());
  }
  split.finish_group(dk.data(), dv_sum.data());

  for (int64_t i = 0; i < bq; ++i)
    for (int64_t x = 0; x < d; ++x) {  // dq = scale sum over both tiles of dS k
      double sum = 0, magnitude = 0;
      for (int64_t key = 0, t = 0; key < keys; key += block, ++t) {
        const int64_t bk = std::min(block, keys - key);
        for (int64_t j = 0; j < bk; ++j) {
          sum += double(scale) * dS[t][i * bk + j] * float(k[(key + j) * d + x]);
          magnitude += double(scale) * dS[t][i * bk + j];
        }
      }
      expect_sum(dq[i * d + x], sum, magnitude, "dq", i, x);
    }
  for (int64_t key = 0, t = 0; key < keys; key += block, ++t) {
    const int64_t bk = std::min(block, keys - key);
    for (int64_t j = 0; j < bk; ++j) {
      for (int64_t x = 0; x < d; ++x) {  // dk = scale dS^T q
        double sum = 0, magnitude = 0;
        for (int64_t i = 0; i < bq; ++i) {
          sum += double(scale) * dS[t][i * bk + j] * float(q[i * d + x]);
          magnitude += double(scale) * dS[t][i * bk + j];
        }
        expect_sum(dk[(key + j) * d + x], sum, magnitude, "dk", key + j, x);
      }
      for (int64_t x = 0; x < dv; ++x) {  // dv = P^T dout
        double sum = 0, magnitude = 0;
        for (int64_t i = 0; i < bq; ++i) {
          sum += double(P[t][i * bk + j]) * float(dout[i * dv + x]);
          magnitude += P[t][i * bk + j];
        }
        expect_sum(dv_sum[(key + j) * dv + x], sum, magnitude, "dv", key + j, x);
      }
    }
  }
}

}  // namespace
