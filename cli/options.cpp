#include "options.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <optional>

namespace relpos::cli {

namespace {

// The whole of `text` as a decimal Int in [lo, hi] (see options.hpp), or
// UsageError naming `option`, the range and the text.
template <class Int>
Int parse_decimal(const std::string& text, const std::string& option, Int lo, Int hi, const std::string& expected) {
  Int value = 0;
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, value, 10);
  if (text.empty() || error != std::errc() || stop != end || value < lo || value > hi)
    throw UsageError{option + ": expected " + expected + ", got '" + text + "'"};
  return value;
}

// The whole of `text` as a finite double, or nothing. chars_format::general:
// decimal digits with an optional fraction and exponent; no hexadecimal, no
// '+', no spaces. inf and nan are read, then refused as not finite; a number
// beyond double is out of range.
std::optional<double> parse_finite(const std::string& text) {
  double value = 0;
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, value, std::chars_format::general);
  if (text.empty() || error != std::errc() || stop != end || !std::isfinite(value)) return std::nullopt;
  return value;
}

template <class Int>
std::string integer_range(Int lo, Int hi) {
  return "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
}

// Each item of a comma-separated list (an empty text is one empty item).
std::vector<std::string> list_items(const std::string& text) {
  std::vector<std::string> items(1);
  for (char c : text) {
    if (c == ',')
      items.emplace_back();
    else
      items.back() += c;
  }
  return items;
}

// CLI11 hands the option's text (the last one given, see the constructor) to
// `read`; the default shown in --help is `shown`, and the help of a command
// with numbers says how they are read.
template <class Read>
void add_parsed(CLI::App& app, const std::string& name, const std::string& help, const std::string& type,
                const std::string& shown, Read read) {
  app.add_option_function<std::string>(name, read, help)->type_name(type)->default_str(shown);
  app.footer("Numbers are decimal; leading zeros mean nothing (016 is 16). A 0x, 0o or 0b prefix, a '+',\n"
             "spaces, or a value outside the option's range are refused.");
}

template <class Int>
void add_integer(CLI::App& app, const std::string& name, Int* target, const std::string& help, Int lo, Int hi) {
  const std::string expected = "a decimal integer in " + integer_range(lo, hi);
  add_parsed(app, name, help, "INT in " + integer_range(lo, hi), std::to_string(*target),
             [=](const std::string& text) { *target = parse_decimal(text, name, lo, hi, expected); });
}

}  // namespace

std::string parse_storage_type(const std::string& text, const std::string& option) {
  if (text == "float32") return text;
  if (text == "bfloat16" || text == "bf16") return "bfloat16";
  if (text == "float16" || text == "fp16") return "float16";
  throw UsageError{option + ": expected float32, bfloat16 (bf16) or float16 (fp16), got '" + text + "'"};
}

std::string joined_list(const std::vector<int64_t>& values) {
  std::string text;
  for (int64_t v : values) text += (text.empty() ? "" : ",") + std::to_string(v);
  return text;
}

Options::Options(const std::string& command, const std::string& summary)
    : app_(std::make_unique<CLI::App>(summary, command)) {
  app_->get_formatter()->column_width(34);
  // An option given twice takes the last value, as most tools do (so a script
  // can append an override to a shared list of options).
  app_->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
}

Options::~Options() = default;

void Options::add_int(const std::string& name, int* target, const std::string& help, int min_value, int max_value) {
  add_integer(*app_, name, target, help, min_value, max_value);
}

void Options::add_int(const std::string& name, int64_t* target, const std::string& help, int64_t min_value,
                      int64_t max_value) {
  add_integer(*app_, name, target, help, min_value, max_value);
}

void Options::add_int_list(const std::string& name, std::vector<int64_t>* target, const std::string& help,
                           int64_t max_value) {
  const std::string range = integer_range<int64_t>(1, max_value);
  const std::string expected = "comma-separated decimal integers in " + range;
  add_parsed(*app_, name, help, "INT,... in " + range, joined_list(*target), [=](const std::string& text) {
    std::vector<int64_t> values;
    for (const std::string& item : list_items(text)) {
      if (item.empty()) throw UsageError{name + ": expected " + expected + ", got an empty item in '" + text + "'"};
      values.push_back(parse_decimal<int64_t>(item, name, 1, max_value, expected));
    }
    *target = values;
  });
}

void Options::add_double(const std::string& name, double* target, const std::string& help, double min_value,
                         double max_value) {
  char bounds[96];
  if (max_value < std::numeric_limits<double>::max())
    std::snprintf(bounds, sizeof bounds, "a finite decimal number in [%g, %g]", min_value, max_value);
  else if (min_value == std::numeric_limits<double>::min())
    std::snprintf(bounds, sizeof bounds, "a finite decimal number > 0");
  else if (min_value > -std::numeric_limits<double>::max())
    std::snprintf(bounds, sizeof bounds, "a finite decimal number >= %g", min_value);
  else
    std::snprintf(bounds, sizeof bounds, "a finite decimal number");
  const std::string expected = bounds;
  add_parsed(*app_, name, help, "NUMBER", CLI::detail::to_string(*target), [=](const std::string& text) {
    const std::optional<double> value = parse_finite(text);
    if (!value || *value < min_value || *value > max_value)
      throw UsageError{name + ": expected " + expected + ", got '" + text + "'"};
    *target = *value;
  });
}

void Options::add_probability(const std::string& name, double* target, const std::string& help) {
  add_parsed(*app_, name, help, "NUMBER in [0, 1)", CLI::detail::to_string(*target), [=](const std::string& text) {
    const std::optional<double> value = parse_finite(text);
    if (!value || !(*value >= 0 && *value < 1))
      throw UsageError{name + ": expected a finite decimal number in [0, 1), got '" + text + "'"};
    *target = *value;
  });
}

void Options::add_string(const std::string& name, std::string* target, const std::string& help) {
  app_->add_option(name, *target, help)->capture_default_str();
}

// Accepted with a hint rather than refused: a script that ran before the
// rename keeps running, and its user learns the new spelling from the hint
// (CLI11 makes this a hidden option of its own, so nothing is awkward).
void Options::add_string(const std::string& name, std::string* target, const std::string& help,
                         const std::string& old_name) {
  CLI::Option* current = app_->add_option(name, *target, help)->capture_default_str();
  const std::string command = app_->get_name();
  // Hidden from --help. Its callback runs after every argument is read (so
  // `current`'s count is known), and after `current`'s, defined first.
  app_->add_option_function<std::string>(old_name,
                                         [=](const std::string& text) {
                                           if (current->count() > 0)
                                             throw UsageError{old_name + " is spelled " + name +
                                                              "; give it once, not both"};
                                           // Once per process: `relpos train --resume` parses twice.
                                           static bool hinted = false;
                                           if (!hinted)
                                             std::fprintf(stderr, "%s: %s is spelled %s; accepted\n",
                                                          command.c_str(), old_name.c_str(), name.c_str());
                                           hinted = true;
                                           *target = text;
                                         })
      ->group("");
}

void Options::add_flag(const std::string& name, bool* target, const std::string& help) {
  app_->add_flag(name, *target, help);
}

bool Options::parse(int argc, char** argv, int first) {
  // CLI11 reads arguments in reverse order from a vector.
  std::vector<std::string> args(argv + first, argv + argc);
  std::reverse(args.begin(), args.end());
  try {
    app_->parse(args);
  } catch (const CLI::CallForHelp&) {
    // CLI11 answers --help before it refuses leftover arguments; refuse them
    // here, as `relpos --help extra` and `relpos --version extra` are.
    if (const std::vector<std::string> extra = app_->remaining(); !extra.empty())
      throw UsageError{"unexpected argument '" + extra.front() + "'"};
    std::fputs(app_->help().c_str(), stdout);
    return false;
  } catch (const CLI::ParseError& e) {
    throw UsageError{e.what()};
  }
  return true;
}

}  // namespace relpos::cli
