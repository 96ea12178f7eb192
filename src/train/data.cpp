#include "relpos/train/data.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace relpos::train {

namespace fs = std::filesystem;

Corpus load_file(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw std::runtime_error("data file '" + path + "' does not exist");
  if (fs::is_directory(path, ec)) throw std::runtime_error("data file '" + path + "' is a directory");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read data file '" + path + "': " + std::strerror(errno));
  // An absolute source, so `relpos eval` finds the file from any folder.
  Corpus c{std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()),
           fs::absolute(path, ec).lexically_normal().string()};
  if (in.bad()) throw std::runtime_error("error reading data file '" + path + "'");
  if (c.bytes.empty()) throw std::runtime_error("data file '" + path + "' is empty");
  return c;
}

std::vector<std::string> default_corpus_files(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw std::runtime_error("default corpus folder '" + dir +
                             "' not found: install Debian's 'fortunes' package (scripts/setup.sh does) or pass --data FILE");
  std::vector<std::string> files;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    const std::string ext = e.path().extension().string();
    if (e.is_regular_file() && ext != ".dat" && ext != ".u8") files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());  // directory order is not deterministic
  if (files.empty()) throw std::runtime_error("default corpus folder '" + dir + "' holds no text files");
  return files;
}

Corpus load_default_corpus(const std::string& dir) {
  Corpus all{{}, "fortunes:" + dir};
  for (const std::string& f : default_corpus_files(dir)) {
    std::ifstream in(f, std::ios::binary);
    if (!in) throw std::runtime_error("cannot read corpus file '" + f + "'");
    all.bytes.insert(all.bytes.end(), std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  if (all.bytes.empty()) throw std::runtime_error("default corpus in '" + dir + "' is empty");
  return all;
}

Corpus load_corpus(const std::string& path) { return path.empty() ? load_default_corpus() : load_file(path); }

Split split_corpus(std::span<const uint8_t> bytes, double validation_fraction) {
  if (!(validation_fraction > 0 && validation_fraction < 1))
    throw std::invalid_argument("validation fraction must be in (0, 1), got " + std::to_string(validation_fraction));
  const size_t validation = size_t(double(bytes.size()) * validation_fraction);
  return {bytes.first(bytes.size() - validation), bytes.last(validation)};
}

uint64_t fnv1a64(std::span<const uint8_t> bytes, uint64_t hash) {
  for (uint8_t b : bytes) hash = (hash ^ b) * 0x100000001b3ull;
  return hash;
}

namespace {
uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
}  // namespace

Rng::Rng(uint64_t seed) {
  for (uint64_t& s : state) s = splitmix64(seed);
}

uint64_t Rng::next() {
  uint64_t* s = state.data();
  const uint64_t result = rotl(s[1] * 5, 7) * 9;
  const uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

uint64_t Rng::uniform(uint64_t n) {
  if (n == 0) throw std::invalid_argument("Rng::uniform: empty range");
  // Reject the top partial block of 2^64 so every value is equally likely.
  const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t x;
  do x = next();
  while (x >= limit);
  return x % n;
}

double Rng::uniform01() { return double(next() >> 11) * 0x1.0p-53; }

BatchSampler::BatchSampler(std::span<const uint8_t> data, int batch, int length, uint64_t seed, Layout layout)
    : data_(data), batch_(batch), length_(length), layout_(layout), rng_(seed) {
  if (batch < 1 || length < 1)
    throw std::invalid_argument("batch and length must be >= 1, got batch " + std::to_string(batch) + ", length " +
                                std::to_string(length));
  const int64_t window = int64_t(length) + 1;
  if (int64_t(data.size()) < window)
    throw std::invalid_argument("training data has " + std::to_string(data.size()) +
                                " bytes, fewer than one window of length + 1 = " + std::to_string(window) +
                                " bytes: use a longer file or a shorter --length");
  if (layout == Layout::contiguous) {
    stream_bytes_ = int64_t(data.size()) / batch;
    if (stream_bytes_ < window)
      throw std::invalid_argument("training data has " + std::to_string(data.size()) + " bytes: too few for " +
                                  std::to_string(batch) + " parallel streams of at least length + 1 = " +
                                  std::to_string(window) + " bytes: use a longer file, a smaller --batch or a shorter --length");
  }
}

bool BatchSampler::next(std::span<uint8_t> out) {
  const size_t window = size_t(length_) + 1;
  if (out.size() != window * size_t(batch_)) throw std::invalid_argument("BatchSampler::next: wrong output size");
  if (layout_ == Layout::random) {
    for (int b = 0; b < batch_; ++b) {
      const uint64_t start = rng_.uniform(data_.size() - window + 1);
      std::copy_n(data_.begin() + int64_t(start), window, out.begin() + int64_t(b * window));
    }
    return false;
  }
  const bool restarted = cursor_ == 0;
  for (int b = 0; b < batch_; ++b)
    std::copy_n(data_.begin() + b * stream_bytes_ + cursor_, window, out.begin() + int64_t(b * window));
  cursor_ += length_;
  if (cursor_ + int64_t(window) > stream_bytes_) cursor_ = 0;
  return restarted;
}

void BatchSampler::restore(const SamplerState& s) {
  if (s.cursor < 0 || (layout_ == Layout::contiguous && s.cursor + length_ + 1 > stream_bytes_) ||
      (layout_ == Layout::random && s.cursor != 0))
    throw std::invalid_argument("sampler state does not fit this data (cursor " + std::to_string(s.cursor) + ")");
  rng_.state = s.rng;
  cursor_ = s.cursor;
}

}  // namespace relpos::train
