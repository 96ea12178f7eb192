// A line plot as a standalone SVG file (no dependencies): one polyline with
// markers per series, axes with ticks, and a legend.
#pragma once

#include <string>
#include <vector>

namespace relpos::cli {

struct PlotSeries {
  std::string name;
  std::vector<double> x, y;  // same size; points with non-finite y are skipped
  bool dashed = false;
};

struct PlotAxes {
  std::string title, x_label, y_label;
  bool log2_x = false;  // x on a log2 scale (ticks at the data's x values)
};

std::string line_plot_svg(const PlotAxes& axes, const std::vector<PlotSeries>& series);

}  // namespace relpos::cli
