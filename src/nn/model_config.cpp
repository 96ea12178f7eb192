// ModelConfig: validation with errors that name the field, and the key=value
// text form stored next to checkpoints.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>

#include "../schemes/registry.hpp"
#include "relpos/nn/model.hpp"
#include "relpos/position.hpp"

namespace relpos::nn {

namespace {

using checks::shortest_text;  // the text that reads back as the number

[[noreturn]] void fail(const std::string& field, const std::string& why) { model_config_error(field, why); }

void check_range(const std::string& field, int64_t value, int64_t low, int64_t high) {
  if (value < low || value > high)
    fail(field, "must lie in [" + std::to_string(low) + ", " + std::to_string(high) + "], got " + std::to_string(value));
}

template <class Int>
Int parse_integer(const std::string& key, const std::string& text) {
  Int value{};
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) fail(key, "not an integer: '" + text + "'");
  return value;
}

double parse_real(const std::string& key, const std::string& text) {
  double value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || !std::isfinite(value))
    fail(key, "not a finite number: '" + text + "'");
  return value;
}

// The model option that `key` names, or nullptr.
const ModelOption* model_option(const std::string& key) {
  const ModelOption* found = nullptr;
  for_each_model_option([&](const ModelOption& o) {
    if (key == o.key) found = &o;
  });
  return found;
}

std::string model_option_keys() {
  std::string keys;
  for_each_model_option([&](const ModelOption& o) { keys += (keys.empty() ? "" : ", ") + std::string(o.key); });
  return keys;
}

// A scheme's option of c in its range (ModelOption).
void check_option(const ModelConfig& c, const ModelOption& o) {
  const double value = o.value_in(c);
  const std::string low = shortest_text(o.low), high = shortest_text(o.high), got = ", got " + shortest_text(value);
  if (o.integer) {
    if (std::isfinite(value) && value == std::floor(value) && value >= o.low && value <= o.high) return;
    fail(o.key, "must be a whole number in [" + low + ", " + high + "]" + got);
  }
  if (std::isfinite(value) && value > o.low && value <= o.high) return;
  const bool bounded = o.high < std::numeric_limits<double>::max();
  fail(o.key, "must be a finite number > " + low + (bounded ? " and <= " + high : "") + got);
}

}  // namespace

const char* to_string(Precision precision) { return precision == Precision::bfloat16 ? "bfloat16" : "float32"; }

Precision parse_precision(const std::string& name) {
  if (name == "float32") return Precision::float32;
  if (name == "bfloat16" || name == "bf16") return Precision::bfloat16;
  throw std::invalid_argument("precision: expected float32 or bfloat16 (bf16), got '" + name + "'");
}

std::vector<PositionKind> all_position_kinds() {
  std::vector<PositionKind> kinds = {"none", "sinusoidal", "learned"};
  AllSchemes::for_each([&](auto scheme) {
    using S = decltype(scheme);
    if (ModelScheme<S> && S::id != Scheme::none) kinds.push_back(S::name);
  });
  return kinds;
}

PositionKind parse_position_kind(const std::string& name) {
  for (const PositionKind& kind : all_position_kinds())
    if (name == kind) return kind;
  throw std::invalid_argument("position: unknown kind '" + name + "' (" + position_kind_names() + ")");
}

std::string position_kind_names() {
  std::string names;
  for (const PositionKind& kind : all_position_kinds()) names += (names.empty() ? "" : ", ") + kind;
  return names;
}

void ModelConfig::validate() const {
  check_range("layers", layers, 1, 1024);
  check_range("width", width, 1, 1 << 16);
  check_range("heads", heads, 1, width);
  if (width % heads != 0)
    fail("heads", "width " + std::to_string(width) + " is not a multiple of heads " + std::to_string(heads));
  check_range("ffn", ffn, 1, 1 << 20);
  check_range("context", context, 1, 1 << 24);
  try {
    parse_position_kind(position);
  } catch (const std::invalid_argument& e) {
    fail("position", e.what());
  }
  if (position == "sinusoidal" && width % 2 != 0)
    fail("width", "sinusoidal embeddings need an even width, got " + std::to_string(width));
  // Every option given, whichever scheme is trained (to_text writes them all,
  // and from_text must read them back), then the trained scheme's across options.
  for (const auto& [key, value] : scheme_options) {
    const ModelOption* option = model_option(key);
    if (!option) fail("scheme_options", "no scheme has the option '" + key + "' (" + model_option_keys() + ")");
    check_option(*this, *option);
  }
  AllSchemes::for_each([&](auto scheme) {
    using S = decltype(scheme);
    if (position != S::name) return;
    if constexpr (requires { S::check_model(*this); }) S::check_model(*this);
  });
}

std::string ModelConfig::to_text() const {
  std::ostringstream out;
  out << "layers=" << layers << "\nwidth=" << width << "\nheads=" << heads << "\nffn=" << ffn
      << "\ncontext=" << context << "\nposition=" << position << "\n";
  for_each_model_option([&](const ModelOption& o) {  // every scheme's, whichever position is chosen
    const double value = o.value_in(*this);
    out << o.key << "=" << (o.integer ? std::to_string(int64_t(value)) : shortest_text(value)) << "\n";
  });
  out << "seed=" << seed << "\n";
  return out.str();
}

ModelConfig ModelConfig::from_text(const std::string& text) {
  ModelConfig c;
  std::set<std::string> seen;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    const std::size_t eq = line.find('=');
    if (eq == std::string::npos) throw std::invalid_argument("ModelConfig: line without '=': '" + line + "'");
    const std::string key = line.substr(0, eq), value = line.substr(eq + 1);
    if (!seen.insert(key).second) fail(key, "given twice");
    if (key == "layers") c.layers = parse_integer<int>(key, value);
    else if (key == "width") c.width = parse_integer<int>(key, value);
    else if (key == "heads") c.heads = parse_integer<int>(key, value);
    else if (key == "ffn") c.ffn = parse_integer<int>(key, value);
    else if (key == "context") c.context = parse_integer<int>(key, value);
    else if (key == "position") {
      try {
        c.position = parse_position_kind(value);
      } catch (const std::invalid_argument& e) {
        fail(key, e.what());
      }
    } else if (key == "seed") {
      c.seed = parse_integer<uint64_t>(key, value);
    } else if (const ModelOption* o = model_option(key)) {
      c.scheme_options[key] = o->integer ? double(parse_integer<int64_t>(key, value)) : parse_real(key, value);
    } else {
      throw std::invalid_argument("ModelConfig: unknown key '" + key + "'");
    }
  }
  c.validate();
  return c;
}

}  // namespace relpos::nn
