// JSON results of the relpos commands, built with nlohmann-json and written
// atomically: strings are valid UTF-8 (bytes of generated text that are not
// UTF-8 become U+FFFD), numbers keep their full precision.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "relpos/train/files.hpp"

namespace relpos::cli {

using Json = nlohmann::ordered_json;  // keys in the order they are set

inline void write_json(const std::string& path, const Json& json) {
  train::write_file_atomic(path, json.dump(2, ' ', false, Json::error_handler_t::replace) + "\n");
}

}  // namespace relpos::cli
