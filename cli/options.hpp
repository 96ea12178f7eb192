// Command-line options of the relpos subcommands, parsed by CLI11: `--name
// value` or `--name=value`, flags, `--help`. Every value is parsed into the
// type it is used as and checked against its range, so a number that does not
// fit is refused naming the option (exit status 2), never narrowed.
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

// "256,512,1024" -> {256, 512, 1024}, each in [1, max_value]; UsageError naming `option` otherwise.
std::vector<int64_t> parse_int_list(const std::string& text, const std::string& option,
                                    int64_t max_value = std::numeric_limits<int64_t>::max());

// --dtype: "float32", "bfloat16" (or "bf16"), "float16" (or "fp16") -> the
// canonical name; UsageError naming `option` otherwise.
std::string parse_storage_type(const std::string& text, const std::string& option);

class Options {
 public:
  Options(const std::string& command, const std::string& summary);
  ~Options();

  void add_int(const std::string& name, int* target, const std::string& help, int min_value,
               int max_value = std::numeric_limits<int>::max());
  void add_int(const std::string& name, int64_t* target, const std::string& help, int64_t min_value,
               int64_t max_value = std::numeric_limits<int64_t>::max());
  // Finite numbers in [min_value, max_value].
  void add_double(const std::string& name, double* target, const std::string& help,
                  double min_value = -std::numeric_limits<double>::max(),
                  double max_value = std::numeric_limits<double>::max());
  void add_string(const std::string& name, std::string* target, const std::string& help);
  void add_flag(const std::string& name, bool* target, const std::string& help);

  // Parses argv[first..argc). Returns false when --help was printed.
  bool parse(int argc, char** argv, int first);

 private:
  std::unique_ptr<CLI::App> app_;
};

}  // namespace relpos::cli
