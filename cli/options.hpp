// A small command-line option parser shared by the relpos subcommands:
// `--name value` or `--name=value`, flags, `--help`, and an error that names
// the bad option (exit status 2) instead of a crash.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace relpos::cli {

// Thrown for a bad command line; main() prints it with the usage hint.
struct UsageError {
  std::string message;
};

// "256,512,1024" -> {256, 512, 1024}; UsageError naming `option` otherwise.
std::vector<int64_t> parse_int_list(const std::string& text, const std::string& option);

class Options {
 public:
  Options(std::string command, std::string summary) : command_(std::move(command)), summary_(std::move(summary)) {}

  void add_int(const std::string& name, int64_t* target, const std::string& help, int64_t min_value = INT64_MIN);
  void add_double(const std::string& name, double* target, const std::string& help);
  void add_string(const std::string& name, std::string* target, const std::string& help);
  void add_flag(const std::string& name, bool* target, const std::string& help);

  // Parses argv[first..argc). Returns false when --help was printed.
  bool parse(int argc, char** argv, int first);
  std::string usage() const;

 private:
  struct Option {
    std::string name, help, default_text;
    bool takes_value;
    std::function<void(const std::string&)> set;
  };
  std::string command_, summary_;
  std::vector<Option> options_;
};

}  // namespace relpos::cli
