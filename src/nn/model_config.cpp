// ModelConfig: validation with errors that name the field, and the key=value
// text form stored next to checkpoints.
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

[[noreturn]] void fail(const std::string& field, const std::string& why) {
  throw std::invalid_argument("ModelConfig." + field + ": " + why);
}

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
    if (decltype(scheme)::id != Scheme::none) kinds.push_back(decltype(scheme)::name);
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
  // The options of the kinds that have them.
  const int head_dim = width / heads;
  if (position == "sinusoidal" && width % 2 != 0)
    fail("width", "sinusoidal embeddings need an even width, got " + std::to_string(width));
  if (position == "shaw") check_range("shaw_k", shaw_k, 0, 1 << 20);
  if (position == "t5") {
    check_range("t5_buckets", t5_buckets, 1, 1 << 16);
    check_range("t5_max_distance", t5_max_distance, 1, 1 << 30);
    try {
      check_t5_config(false, t5_buckets, t5_max_distance);
    } catch (const std::invalid_argument& e) {
      fail(std::string(e.what()).find("max_distance") != std::string::npos ? "t5_max_distance" : "t5_buckets",
           e.what());
    }
  }
  if (position == "alibi") check_range("heads", heads, 1, 65536);
  if (position == "rope") {
    if (head_dim % 2 != 0) fail("heads", "RoPE needs an even head dimension width / heads, got " + std::to_string(head_dim));
    if (!(rope_base > 1.0) || !std::isfinite(rope_base)) fail("rope_base", "must be a finite number > 1");
  }
  if (position == "xl") {
    if (width % 2 != 0) fail("width", "Transformer-XL's sinusoid needs an even width, got " + std::to_string(width));
    check_range("xl_memory", xl_memory, 0, 1 << 24);
  }
}

std::string ModelConfig::to_text() const {
  std::ostringstream out;
  char base[64];
  const auto [end, error] = std::to_chars(base, base + sizeof base, rope_base);  // shortest round-trip form
  (void)error;
  out << "layers=" << layers << "\nwidth=" << width << "\nheads=" << heads << "\nffn=" << ffn
      << "\ncontext=" << context << "\nposition=" << position << "\nshaw_k=" << shaw_k
      << "\nt5_buckets=" << t5_buckets << "\nt5_max_distance=" << t5_max_distance
      << "\nrope_base=" << std::string(base, end) << "\nxl_memory=" << xl_memory << "\nseed=" << seed << "\n";
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
    } else if (key == "shaw_k") c.shaw_k = parse_integer<int>(key, value);
    else if (key == "t5_buckets") c.t5_buckets = parse_integer<int>(key, value);
    else if (key == "t5_max_distance") c.t5_max_distance = parse_integer<int>(key, value);
    else if (key == "rope_base") c.rope_base = parse_real(key, value);
    else if (key == "xl_memory") c.xl_memory = parse_integer<int>(key, value);
    else if (key == "seed") c.seed = parse_integer<uint64_t>(key, value);
    else throw std::invalid_argument("ModelConfig: unknown key '" + key + "'");
  }
  c.validate();
  return c;
}

}  // namespace relpos::nn
