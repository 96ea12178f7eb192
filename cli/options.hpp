// Command-line options of the relpos subcommands, parsed by CLI11: `--name
// value` or `--name=value`, flags, `--help`.
//
// Numbers are read here, not by CLI11 (whose integers take 0x, 0o and 0b
// prefixes and read a leading 0 as octal): std::from_chars in base 10 reads
// decimal digits, with a '-' in front for a negative value. Leading zeros
// mean nothing ("016" is 16); a '+', a 0x / 0o / 0b prefix, spaces, an empty
// value or anything after the number are refused. Every value is parsed into
// the type it is used as and checked against the option's declared range, so
// a number that does not fit is refused naming the option and the range
// (exit status 2), never clamped or narrowed.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "relpos/attention.hpp"

namespace CLI {
class App;
}

namespace relpos::cli {

// Thrown for a bad command line; main() prints it with the usage hint.
struct UsageError {
  std::string message;
};

using relpos::kMaxThreads;

// --dtype: "float32", "bfloat16" (or "bf16"), "float16" (or "fp16") -> the
// canonical name; UsageError naming `option` otherwise.
std::string parse_storage_type(const std::string& text, const std::string& option);

class Options {
 public:
  Options(const std::string& command, const std::string& summary);
  ~Options();

  // A decimal integer in [min_value, max_value].
  void add_int(const std::string& name, int* target, const std::string& help, int min_value, int max_value);
  void add_int(const std::string& name, int64_t* target, const std::string& help, int64_t min_value,
               int64_t max_value);
  // "256,512,1024": decimal integers in [1, max_value], comma-separated; no
  // item may be empty ("8,", ",8", "8,,16" and "" are refused).
  void add_int_list(const std::string& name, std::vector<int64_t>* target, const std::string& help,
                    int64_t max_value);
  // A finite decimal number in [min_value, max_value]; min_value =
  // numeric_limits<double>::min() means > 0.
  void add_double(const std::string& name, double* target, const std::string& help,
                  double min_value = -std::numeric_limits<double>::max(),
                  double max_value = std::numeric_limits<double>::max());
  // A probability that may be 0 but not 1: a finite decimal number in [0, 1).
  void add_probability(const std::string& name, double* target, const std::string& help);
  void add_string(const std::string& name, std::string* target, const std::string& help);
  // The same, also under `old_name`, an earlier spelling that keeps working:
  // hidden from --help, it sets `target` and prints one line on stderr
  // ("relpos train: --position is spelled --positions; accepted"). Given
  // together with `name`, it is refused (which of the two would win is not
  // obvious).
  void add_string(const std::string& name, std::string* target, const std::string& help,
                  const std::string& old_name);
  void add_flag(const std::string& name, bool* target, const std::string& help);

  // Parses argv[first..argc). Returns false when --help was printed; with
  // --help, an argument that is not an option is still refused.
  bool parse(int argc, char** argv, int first);

 private:
  std::unique_ptr<CLI::App> app_;
};

// "8192,16384" (for headers and messages).
std::string joined_list(const std::vector<int64_t>& values);

}  // namespace relpos::cli
