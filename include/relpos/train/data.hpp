// Training data for the byte-level language models: a corpus read from any
// file (or the default English corpus), split into a training and a
// validation part, and batch samplers whose state fits in a checkpoint.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace relpos::train {

// Where Debian's `fortunes` package puts its plain-text English files.
inline constexpr const char* kDefaultCorpusDir = "/usr/share/games/fortunes";

struct Corpus {
  std::vector<uint8_t> bytes;
  std::string source;  // the file (absolute path), or "fortunes:<dir>" for the default corpus
};

// Reads a file as bytes. Throws std::runtime_error naming the file when it is
// missing, unreadable or empty.
Corpus load_file(const std::string& path);
// The default corpus: the plain-text files of `dir` (every regular file that is
// not a .dat index or a .u8 copy), in sorted name order, concatenated.
std::vector<std::string> default_corpus_files(const std::string& dir = kDefaultCorpusDir);
Corpus load_default_corpus(const std::string& dir = kDefaultCorpusDir);
// load_file(path), or the default corpus when path is empty.
Corpus load_corpus(const std::string& path);

// A contiguous split: the last `validation_fraction` of the bytes (rounded
// down) validate, everything before trains. Contiguous so that no validation
// window overlaps a training window.
struct Split {
  std::span<const uint8_t> train, validation;
};
Split split_corpus(std::span<const uint8_t> bytes, double validation_fraction = 0.1);

// FNV-1a 64 over bytes, continuing from `hash` (the offset basis by default).
uint64_t fnv1a64(std::span<const uint8_t> bytes, uint64_t hash = 0xcbf29ce484222325ull);

// xoshiro256** seeded through splitmix64: small, fast, and its whole state is
// four words, so a checkpoint can hold it and resume the same stream.
class Rng {
 public:
  explicit Rng(uint64_t seed = 0);
  uint64_t next();
  uint64_t uniform(uint64_t n);  // uniform in [0, n), n >= 1, without modulo bias
  double uniform01();            // uniform in [0, 1), 53 bits
  std::array<uint64_t, 4> state{};
};

// What a checkpoint stores of a sampler.
struct SamplerState {
  std::array<uint64_t, 4> rng{};
  int64_t cursor = 0;
};

// Batches of (batch, length + 1) bytes: row b predicts bytes 1..length from
// 0..length-1. Two layouts:
//  random:     every row a window at a uniformly random start (seeded);
//  contiguous: the data cut into `batch` equal streams, row b reading stream b
//              in consecutive segments that overlap by one byte, so a model's
//              memory (Transformer-XL) carries over from one batch to the next.
class BatchSampler {
 public:
  enum class Layout { random, contiguous };
  // Throws std::invalid_argument when the data cannot hold one window
  // (random) or `batch` streams of one window each (contiguous).
  BatchSampler(std::span<const uint8_t> data, int batch, int length, uint64_t seed, Layout layout);

  // Fills out (batch * (length + 1) bytes). Returns true when the contiguous
  // streams (re)start at their beginning, i.e. a memory must be cleared;
  // always false for the random layout.
  bool next(std::span<uint8_t> out);

  SamplerState state() const { return {rng_.state, cursor_}; }
  void restore(const SamplerState& s);

 private:
  std::span<const uint8_t> data_;
  int batch_, length_;
  Layout layout_;
  Rng rng_;
  int64_t stream_bytes_ = 0;  // contiguous: bytes per stream
  int64_t cursor_ = 0;        // contiguous: offset of the next segment in every stream
};

}  // namespace relpos::train
