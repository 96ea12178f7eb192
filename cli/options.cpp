#include "options.hpp"

#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <sstream>

namespace relpos::cli {

namespace {

template <class Int>
void add_integer(CLI::App& app, const std::string& name, Int* target, const std::string& help, Int lo, Int hi) {
  // CLI11 parses into Int itself and refuses what does not fit it; the range
  // check gives the option's own limits.
  app.add_option(name, *target, help)->capture_default_str()->check(CLI::Range(lo, hi));
}

}  // namespace

std::string parse_storage_type(const std::string& text, const std::string& option) {
  if (text == "float32") return text;
  if (text == "bfloat16" || text == "bf16") return "bfloat16";
  if (text == "float16" || text == "fp16") return "float16";
  throw UsageError{option + ": expected float32, bfloat16 (bf16) or float16 (fp16), got '" + text + "'"};
}

std::vector<int64_t> parse_int_list(const std::string& text, const std::string& option, int64_t max_value) {
  std::vector<int64_t> values;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    int64_t v = 0;
    if (!CLI::detail::lexical_cast(item, v) || v < 1 || v > max_value)
      throw UsageError{option + ": expected integers in [1, " + std::to_string(max_value) + "], got '" + item + "'"};
    values.push_back(v);
  }
  if (values.empty()) throw UsageError{option + ": empty list"};
  return values;
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

void Options::add_double(const std::string& name, double* target, const std::string& help, double min_value,
                         double max_value) {
  char bounds[96];
  if (max_value < std::numeric_limits<double>::max())
    std::snprintf(bounds, sizeof bounds, "a finite number in [%g, %g]", min_value, max_value);
  else if (min_value == std::numeric_limits<double>::min())
    std::snprintf(bounds, sizeof bounds, "a finite number > 0");
  else if (min_value > -std::numeric_limits<double>::max())
    std::snprintf(bounds, sizeof bounds, "a finite number >= %g", min_value);
  else
    std::snprintf(bounds, sizeof bounds, "a finite number");
  const std::string expected = bounds;
  const CLI::Validator in_range(
      [=](std::string& text) {
        double v = 0;
        const bool ok = CLI::detail::lexical_cast(text, v) && std::isfinite(v) && v >= min_value && v <= max_value;
        return ok ? std::string() : "must be " + expected + ", got " + text;
      },
      "NUMBER");
  app_->add_option(name, *target, help)->capture_default_str()->check(in_range);
}

void Options::add_string(const std::string& name, std::string* target, const std::string& help) {
  app_->add_option(name, *target, help)->capture_default_str();
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
    std::fputs(app_->help().c_str(), stdout);
    return false;
  } catch (const CLI::ParseError& e) {
    throw UsageError{e.what()};
  }
  return true;
}

}  // namespace relpos::cli
