// Every file relpos writes (checkpoints, JSON results, plots) goes through
// write_file_atomic: a crash, a kill or a full disk leaves the old file or the
// new one, never a mix, and never a half-written result under the real name.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace relpos::train {

// Writes bytes to path atomically: a temporary file in the same folder (named
// after the target and this process's id), fsync, rename over the target,
// fsync of the folder. Creates the folder if needed. Temporaries of the same
// target left by processes that died (kill -9 during a save) are removed
// first. Throws std::runtime_error naming the file; the target is then unchanged.
void write_file_atomic(const std::string& path, std::span<const uint8_t> bytes);
void write_file_atomic(const std::string& path, const std::string& text);

// Throws std::runtime_error naming the path and the reason unless a file can be
// written there: not a folder, its folder exists or can be created, and a file
// can be created in it. For refusing before work that would be lost at its end.
void check_writable_file(const std::string& path);

}  // namespace relpos::train
