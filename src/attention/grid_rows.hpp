// A tile row's pairs on a grid (docs/design.md, "Positions on a grid"): query
// row i against keys j0 .. j0 + n - 1, which run along grid rows of the key
// grid. Each run of keys on one grid row shares its y offset; along it the x
// offsets are the query column's list (GridAxes::x_of). Both grid terms read
// a value per pair as
//   value(y, x) = ys[y] + xs[y * x_stride + x]
// SAM's tables: ys, xs the query's scores against the y and x tables
// (x_stride 0); Swin's bias: no ys, xs the head's bias by (y, x) offsets
// (x_stride the x offsets' count).
#pragma once

#include <algorithm>
#include <cstdint>

#include "../schemes/scheme.hpp"

namespace relpos {

// Calls f(jj, count, y, xs_of_row) for each run of keys [jj, jj + count) of
// the tile row on one key grid row: y its offset index, xs_of_row the x
// offsets' indices of the run's keys.
template <class F>
void for_each_grid_run(const GridAxes& a, int64_t i, int64_t j0, int64_t n, F&& f) {
  const GridShape& g = a.shape();
  const int64_t yq = i / g.qw;
  const int32_t* x_of_query = a.x_of(i % g.qw);
  for (int64_t jj = 0; jj < n;) {
    const int64_t j = j0 + jj, x0 = j % g.kw, count = std::min(g.kw - x0, n - jj);
    f(jj, count, a.y(yq, j / g.kw), x_of_query + x0);
    jj += count;
  }
}

// row[jj] += value(y, x) of each key of the tile row (ys may be null: 0).
template <class T>
void add_grid_row(const GridAxes& a, int64_t i, int64_t j0, int64_t n, const T* ys, const T* xs, int64_t x_stride,
                  T* row) {
  for_each_grid_run(a, i, j0, n, [&](int64_t jj, int64_t count, int32_t y, const int32_t* x) {
    const T base = ys ? ys[y] : T(0);
    const T* by_x = xs + y * x_stride;
    for (int64_t c = 0; c < count; ++c) row[jj + c] += base + by_x[x[c]];
  });
}

// The same backwards: dys[y] and dxs[y * x_stride + x] gain each key's
// ds[jj] (dys may be null: not wanted).
template <class T>
void sum_grid_row(const GridAxes& a, int64_t i, int64_t j0, int64_t n, const T* ds, T* dys, T* dxs,
                  int64_t x_stride) {
  for_each_grid_run(a, i, j0, n, [&](int64_t jj, int64_t count, int32_t y, const int32_t* x) {
    T* by_x = dxs + y * x_stride;
    T run = 0;
    for (int64_t c = 0; c < count; ++c) {
      by_x[x[c]] += ds[jj + c];
      run += ds[jj + c];
    }
    if (dys) dys[y] += run;
  });
}

}  // namespace relpos
