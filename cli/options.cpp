#include "options.hpp"

#include <cstdio>
#include <sstream>

namespace relpos::cli {

namespace {
template <class T>
std::string text(const T& v) {
  std::ostringstream o;
  o << v;
  return o.str();
}
}  // namespace

std::vector<int64_t> parse_int_list(const std::string& text, const std::string& option) {
  std::vector<int64_t> values;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (...) {
      used = 0;
    }
    if (used != item.size() || v < 1) throw UsageError{option + ": expected positive integers, got '" + item + "'"};
    values.push_back(v);
  }
  if (values.empty()) throw UsageError{option + ": empty list"};
  return values;
}

void Options::add_int(const std::string& name, int64_t* target, const std::string& help, int64_t min_value) {
  options_.push_back({name, help, text(*target), true, [name, target, min_value](const std::string& s) {
                        size_t used = 0;
                        int64_t v = 0;
                        try {
                          v = std::stoll(s, &used);
                        } catch (...) {
                          used = 0;
                        }
                        if (used != s.size() || s.empty()) throw UsageError{name + ": expected an integer, got '" + s + "'"};
                        if (v < min_value) throw UsageError{name + ": must be >= " + text(min_value) + ", got " + s};
                        *target = v;
                      }});
}

void Options::add_double(const std::string& name, double* target, const std::string& help) {
  options_.push_back({name, help, text(*target), true, [name, target](const std::string& s) {
                        size_t used = 0;
                        try {
                          *target = std::stod(s, &used);
                        } catch (...) {
                          used = 0;
                        }
                        if (used != s.size() || s.empty()) throw UsageError{name + ": expected a number, got '" + s + "'"};
                      }});
}

void Options::add_string(const std::string& name, std::string* target, const std::string& help) {
  options_.push_back({name, help, *target, true, [target](const std::string& s) { *target = s; }});
}

void Options::add_flag(const std::string& name, bool* target, const std::string& help) {
  options_.push_back({name, help, "", false, [target](const std::string&) { *target = true; }});
}

bool Options::parse(int argc, char** argv, int first) {
  for (int a = first; a < argc; ++a) {
    std::string arg = argv[a], value;
    if (arg == "--help" || arg == "-h") {
      std::fputs(usage().c_str(), stdout);
      return false;
    }
    const size_t eq = arg.find('=');
    const bool inline_value = arg.rfind("--", 0) == 0 && eq != std::string::npos;
    if (inline_value) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    }
    const Option* match = nullptr;
    for (const Option& o : options_)
      if (o.name == arg) match = &o;
    if (!match) throw UsageError{"unknown option '" + arg + "'"};
    if (match->takes_value && !inline_value) {
      if (a + 1 >= argc) throw UsageError{arg + ": missing value"};
      value = argv[++a];
    }
    if (!match->takes_value && inline_value) throw UsageError{arg + ": takes no value"};
    match->set(value);
  }
  return true;
}

std::string Options::usage() const {
  std::ostringstream o;
  o << "usage: " << command_ << " [options]\n\n" << summary_ << "\n\noptions:\n";
  for (const Option& opt : options_) {
    std::string left = "  " + opt.name + (opt.takes_value ? " VALUE" : "");
    if (left.size() < 26) left.resize(26, ' ');
    o << left << ' ' << opt.help;
    if (opt.takes_value && !opt.default_text.empty()) o << " (default: " << opt.default_text << ")";
    o << '\n';
  }
  o << "  -h, --help               show this help\n";
  return o.str();
}

}  // namespace relpos::cli
