#include "svg_plot.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <sstream>
#include <stdexcept>

namespace relpos::cli {

namespace {

// Categorical colours that stay distinguishable for nine lines (Tableau 10).
constexpr const char* kColours[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                    "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

// A step of 1, 2 or 5 times a power of ten giving about `count` ticks over span.
double nice_step(double span, int count) {
  const double raw = span / count, power = std::pow(10, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0})
    if (m * power >= raw) return m * power;
  return 10 * power;
}

}  // namespace

std::string line_plot_svg(const PlotAxes& axes, const std::vector<PlotSeries>& series) {
  double x_lo = INFINITY, x_hi = -INFINITY, y_lo = INFINITY, y_hi = -INFINITY;
  std::set<double> xs;
  const auto tx = [&](double x) { return axes.log2_x ? std::log2(x) : x; };
  for (const PlotSeries& s : series) {
    if (s.x.size() != s.y.size()) throw std::invalid_argument("plot series '" + s.name + "': x and y differ in size");
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!std::isfinite(s.y[i]) || (axes.log2_x && !(s.x[i] > 0))) continue;
      x_lo = std::min(x_lo, tx(s.x[i])), x_hi = std::max(x_hi, tx(s.x[i]));
      y_lo = std::min(y_lo, s.y[i]), y_hi = std::max(y_hi, s.y[i]);
      xs.insert(s.x[i]);
    }
  }
  if (xs.empty()) throw std::invalid_argument("plot: no finite points");
  if (x_hi == x_lo) x_lo -= 1, x_hi += 1;
  if (y_hi == y_lo) y_lo -= 0.5, y_hi += 0.5;
  const double y_step = nice_step(y_hi - y_lo, 6);
  y_lo = std::floor(y_lo / y_step) * y_step;
  y_hi = std::ceil(y_hi / y_step) * y_step;

  constexpr double W = 760, H = 460, left = 70, right = 170, top = 40, bottom = 60;
  const double pw = W - left - right, ph = H - top - bottom;
  const auto px = [&](double x) { return left + (tx(x) - x_lo) / (x_hi - x_lo) * pw; };
  const auto py = [&](double y) { return top + (y_hi - y) / (y_hi - y_lo) * ph; };

  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H << "\" viewBox=\"0 0 " << W
    << ' ' << H << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text x=\"" << num(left + pw / 2) << "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">" << escape(axes.title)
    << "</text>\n";
  // As many decimals as the tick step needs (0.05 -> 2, 0.5 -> 1, 2 -> 0).
  const int decimals = std::max(0, int(-std::floor(std::log10(y_step) + 1e-9)));
  const auto tick = [&](double y) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.*f", decimals, y);
    return std::string(buf);
  };
  for (double y = y_lo; y <= y_hi + y_step / 2; y += y_step) {  // horizontal grid and y ticks
    o << "<line x1=\"" << num(left) << "\" x2=\"" << num(left + pw) << "\" y1=\"" << num(py(y)) << "\" y2=\""
      << num(py(y)) << "\" stroke=\"#ddd\"/>\n<text x=\"" << num(left - 6) << "\" y=\"" << num(py(y) + 4)
      << "\" text-anchor=\"end\">" << tick(y) << "</text>\n";
  }
  for (double x : xs) {  // vertical grid and x ticks at the data's x values
    char label[32];
    std::snprintf(label, sizeof label, "%g", x);
    o << "<line x1=\"" << num(px(x)) << "\" x2=\"" << num(px(x)) << "\" y1=\"" << num(top) << "\" y2=\""
      << num(top + ph) << "\" stroke=\"#eee\"/>\n<text x=\"" << num(px(x)) << "\" y=\"" << num(top + ph + 18)
      << "\" text-anchor=\"middle\">" << label << "</text>\n";
  }
  o << "<rect x=\"" << num(left) << "\" y=\"" << num(top) << "\" width=\"" << num(pw) << "\" height=\"" << num(ph)
    << "\" fill=\"none\" stroke=\"#333\"/>\n"
    << "<text x=\"" << num(left + pw / 2) << "\" y=\"" << num(H - 16) << "\" text-anchor=\"middle\">"
    << escape(axes.x_label) << "</text>\n"
    << "<text transform=\"translate(18 " << num(top + ph / 2) << ") rotate(-90)\" text-anchor=\"middle\">"
    << escape(axes.y_label) << "</text>\n";
  for (size_t k = 0; k < series.size(); ++k) {
    const PlotSeries& s = series[k];
    const char* colour = kColours[k % std::size(kColours)];
    std::ostringstream points, marks;
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!std::isfinite(s.y[i]) || (axes.log2_x && !(s.x[i] > 0))) continue;
      points << num(px(s.x[i])) << ',' << num(py(s.y[i])) << ' ';
      marks << "<circle cx=\"" << num(px(s.x[i])) << "\" cy=\"" << num(py(s.y[i])) << "\" r=\"3\" fill=\"" << colour
            << "\"/>\n";
    }
    o << "<polyline fill=\"none\" stroke=\"" << colour << "\" stroke-width=\"2\""
      << (s.dashed ? " stroke-dasharray=\"6 4\"" : "") << " points=\"" << points.str() << "\"/>\n"
      << marks.str();
    const double ly = top + 10 + 20 * double(k);
    o << "<line x1=\"" << num(W - right + 14) << "\" x2=\"" << num(W - right + 38) << "\" y1=\"" << num(ly)
      << "\" y2=\"" << num(ly) << "\" stroke=\"" << colour << "\" stroke-width=\"2\""
      << (s.dashed ? " stroke-dasharray=\"6 4\"" : "") << "/>\n<text x=\"" << num(W - right + 44) << "\" y=\""
      << num(ly + 4) << "\">" << escape(s.name) << "</text>\n";
  }
  o << "</svg>\n";
  return o.str();
}

}  // namespace relpos::cli
