#include "relpos/train/files.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace relpos::train {

namespace fs = std::filesystem;

namespace {

std::runtime_error io_error(const std::string& what, const std::string& path) {
  return std::runtime_error(what + " '" + path + "': " + std::strerror(errno));
}

void write_all(int fd, const uint8_t* p, size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw io_error("cannot write", path);
    p += w;
    n -= size_t(w);
  }
}

fs::path folder_of(const fs::path& target) { return target.has_parent_path() ? target.parent_path() : fs::path("."); }

// Temporaries are hidden files ".<name>.<pid>.XXXXXX" beside the target, so
// the rename never crosses file systems and a leftover names its writer.
std::string temporary_prefix(const fs::path& target) {
  std::string prefix = ".";  // appended step by step: GCC 12 warns (-Wrestrict) on "." + name + "."
  prefix.append(target.filename().string()).append(".");
  return prefix;
}

// Removes the temporaries of `target` whose writing process no longer exists.
void remove_stale_temporaries(const fs::path& target) {
  const std::string prefix = temporary_prefix(target);
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(folder_of(target), ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string rest = name.substr(prefix.size());  // "<pid>.XXXXXX"
    const size_t dot = rest.find('.');
    if (dot == std::string::npos || dot == 0 || rest.size() - dot != 7) continue;
    const std::string pid_text = rest.substr(0, dot);
    if (pid_text.find_first_not_of("0123456789") != std::string::npos || pid_text.size() > 9) continue;
    const pid_t pid = pid_t(std::stol(pid_text));
    if (pid != ::getpid() && ::kill(pid, 0) != 0 && errno == ESRCH) fs::remove(entry.path(), ec);
  }
}

}  // namespace

void check_writable_file(const std::string& path) {
  const fs::path target(path);
  std::error_code ec;
  if (path.empty()) throw std::runtime_error("no file name given");
  if (fs::is_directory(target, ec)) throw std::runtime_error("'" + path + "' is a folder, not a file");
  const fs::path folder = folder_of(target);
  fs::create_directories(folder, ec);
  if (ec) throw std::runtime_error("cannot create folder '" + folder.string() + "' for '" + path + "': " + ec.message());
  std::string probe = (folder / (temporary_prefix(target) + std::to_string(::getpid()) + ".XXXXXX")).string();
  const int fd = ::mkstemp(probe.data());
  if (fd < 0) throw io_error("cannot write into the folder of", path);
  ::close(fd);
  ::unlink(probe.c_str());
}

void write_file_atomic(const std::string& path, std::span<const uint8_t> bytes) {
  const fs::path target(path);
  const fs::path folder = folder_of(target);
  std::error_code ec;
  fs::create_directories(folder, ec);
  if (ec) throw std::runtime_error("cannot create folder '" + folder.string() + "': " + ec.message());
  if (fs::is_directory(target, ec)) throw std::runtime_error("cannot write '" + path + "': it is a folder");
  remove_stale_temporaries(target);
  std::string temp = (folder / (temporary_prefix(target) + std::to_string(::getpid()) + ".XXXXXX")).string();
  const int fd = ::mkstemp(temp.data());
  if (fd < 0) throw io_error("cannot create a temporary file next to", path);
  try {
    write_all(fd, bytes.data(), bytes.size(), temp);
    if (::fsync(fd) != 0) throw io_error("cannot sync", temp);
    if (::fchmod(fd, 0644) != 0) throw io_error("cannot set the mode of", temp);
  } catch (...) {
    ::close(fd);
    ::unlink(temp.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    ::unlink(temp.c_str());
    throw io_error("cannot close", temp);
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const auto error = io_error("cannot rename a temporary file onto", path);
    ::unlink(temp.c_str());
    throw error;
  }
  // The rename is durable only once the folder's entry is on disk.
  const int dir = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY);
  if (dir < 0) throw io_error("cannot open folder", folder.string());
  const int synced = ::fsync(dir);
  ::close(dir);
  if (synced != 0) throw io_error("cannot sync folder", folder.string());
}

void write_file_atomic(const std::string& path, const std::string& text) {
  write_file_atomic(path, std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

}  // namespace relpos::train
