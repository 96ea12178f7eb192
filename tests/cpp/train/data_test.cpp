// The trainer's data: loading, the default corpus, the split and the samplers.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <stdexcept>

#include "relpos/train/data.hpp"
#include "train/test_files.hpp"

namespace {

using namespace relpos::train;
using relpos_train_test::TempDir;
using relpos_train_test::write_bytes;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(TrainData, LoadFileRefusesMissingEmptyAndFolder) {
  TempDir dir;
  write_bytes(dir.file("empty.txt"), {});
  EXPECT_NE(error_of([&] { load_file(dir.file("nope.txt")); }).find("does not exist"), std::string::npos);
  EXPECT_NE(error_of([&] { load_file(dir.file("empty.txt")); }).find("is empty"), std::string::npos);
  EXPECT_NE(error_of([&] { load_file(dir.path().string()); }).find("is a directory"), std::string::npos);
  write_bytes(dir.file("data.bin"), {0, 255, 10, 13, 0});
  const Corpus c = load_file(dir.file("data.bin"));
  EXPECT_EQ(c.bytes, (std::vector<uint8_t>{0, 255, 10, 13, 0}));
  EXPECT_EQ(c.source, dir.file("data.bin"));
}

TEST(TrainData, DefaultCorpusTakesTextFilesInSortedOrder) {
  TempDir dir;
  write_bytes(dir.file("zoo"), {'z'});
  write_bytes(dir.file("art"), {'a', 'b'});
  write_bytes(dir.file("art.dat"), {'X'});
  write_bytes(dir.file("art.u8"), {'Y'});
  write_bytes(dir.file("men-women"), {'m'});
  std::filesystem::create_directory(dir.file("sub"));
  const auto files = default_corpus_files(dir.path().string());
  ASSERT_EQ(files.size(), 3u);
  EXPECT_EQ(files[0], dir.file("art"));
  EXPECT_EQ(files[1], dir.file("men-women"));
  EXPECT_EQ(files[2], dir.file("zoo"));
  EXPECT_EQ(load_default_corpus(dir.path().string()).bytes, (std::vector<uint8_t>{'a', 'b', 'm', 'z'}));
  EXPECT_NE(error_of([&] { default_corpus_files(dir.file("missing")); }).find("fortunes"), std::string::npos);
}

TEST(TrainData, SplitIsContiguousWithTheLastTenthValidating) {
  std::vector<uint8_t> bytes(1005);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = uint8_t(i);
  const Split s = split_corpus(bytes, 0.1);
  EXPECT_EQ(s.train.size(), 905u);  // 10% of 1005 rounded down = 100 validate
  EXPECT_EQ(s.validation.size(), 100u);
  EXPECT_EQ(s.train.data(), bytes.data());
  EXPECT_EQ(s.validation.data(), bytes.data() + 905);
  EXPECT_THROW(split_corpus(bytes, 0.0), std::invalid_argument);
  EXPECT_THROW(split_corpus(bytes, 1.0), std::invalid_argument);
}

TEST(TrainData, SamplerRefusesDataShorterThanOneWindow) {
  const std::vector<uint8_t> bytes(16, 'a');
  // length 16 needs 17 bytes
  EXPECT_NE(error_of([&] { BatchSampler(bytes, 2, 16, 1, BatchSampler::Layout::random); }).find("fewer than one window"),
            std::string::npos);
  EXPECT_NO_THROW(BatchSampler(bytes, 2, 15, 1, BatchSampler::Layout::random));
  // 4 streams of 16 / 4 = 4 bytes cannot hold a window of 4 + 1
  EXPECT_NE(error_of([&] { BatchSampler(bytes, 4, 4, 1, BatchSampler::Layout::contiguous); }).find("parallel streams"),
            std::string::npos);
  EXPECT_NO_THROW(BatchSampler(bytes, 4, 3, 1, BatchSampler::Layout::contiguous));
  EXPECT_THROW(BatchSampler(bytes, 0, 3, 1, BatchSampler::Layout::random), std::invalid_argument);
}

TEST(TrainData, RandomWindowsAreSubstringsAndDeterministic) {
  std::vector<uint8_t> bytes(300);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = uint8_t(i * 37 % 251);  // every 251-window distinct
  const int batch = 5, length = 9;
  BatchSampler a(bytes, batch, length, 42, BatchSampler::Layout::random);
  BatchSampler b(bytes, batch, length, 42, BatchSampler::Layout::random);
  BatchSampler c(bytes, batch, length, 43, BatchSampler::Layout::random);
  std::vector<uint8_t> ta(batch * (length + 1)), tb(ta.size()), tc(ta.size());
  std::set<size_t> starts;
  bool differs = false;
  for (int step = 0; step < 50; ++step) {
    EXPECT_FALSE(a.next(ta));
    b.next(tb);
    c.next(tc);
    EXPECT_EQ(ta, tb);
    differs = differs || ta != tc;
    for (int r = 0; r < batch; ++r) {
      const auto row = ta.begin() + r * (length + 1);
      const auto it = std::search(bytes.begin(), bytes.end(), row, row + length + 1);
      ASSERT_NE(it, bytes.end());
      starts.insert(size_t(it - bytes.begin()));
    }
  }
  EXPECT_TRUE(differs);
  EXPECT_GT(starts.size(), 150u);  // 250 windows spread over 290 starts, not a few repeated ones
}

TEST(TrainData, ContiguousStreamsReadConsecutiveSegmentsAndRestart) {
  std::vector<uint8_t> bytes(40);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = uint8_t(i);
  // 2 streams of 20 bytes; segments of 6 + 1 at 0, 6, 12 (12 + 7 = 19 <= 20), then back to 0.
  BatchSampler s(bytes, 2, 6, 1, BatchSampler::Layout::contiguous);
  std::vector<uint8_t> t(2 * 7);
  const int64_t expected_start[] = {0, 6, 12, 0, 6};
  for (int k = 0; k < 5; ++k) {
    EXPECT_EQ(s.next(t), expected_start[k] == 0) << "segment " << k;
    for (int r = 0; r < 2; ++r)
      for (int i = 0; i < 7; ++i) EXPECT_EQ(t[r * 7 + i], uint8_t(r * 20 + expected_start[k] + i));
  }
}

TEST(TrainData, SamplerStateRestoresTheSameStream) {
  const auto bytes = relpos_train_test::sample_text(500);
  for (auto layout : {BatchSampler::Layout::random, BatchSampler::Layout::contiguous}) {
    BatchSampler a(bytes, 3, 8, 7, layout);
    std::vector<uint8_t> ta(27), tb(27);
    for (int i = 0; i < 11; ++i) a.next(ta);
    BatchSampler b(bytes, 3, 8, 999, layout);
    b.restore(a.state());
    for (int i = 0; i < 20; ++i) {
      EXPECT_EQ(a.next(ta), b.next(tb));
      EXPECT_EQ(ta, tb);
    }
  }
  BatchSampler c(bytes, 3, 8, 7, BatchSampler::Layout::contiguous);
  EXPECT_THROW(c.restore(SamplerState{{}, 1000}), std::invalid_argument);
}

TEST(TrainData, RngUniformStaysInRangeAndCoversIt) {
  Rng rng(5);
  std::vector<int> hits(7, 0);
  for (int i = 0; i < 7000; ++i) ++hits[rng.uniform(7)];
  for (int h : hits) EXPECT_NEAR(h, 1000, 150);
  for (int i = 0; i < 1000; ++i) {
    const double u = rng.uniform01();
    EXPECT_GE(u, 0.0);
    EXPECT_LT(u, 1.0);
  }
  EXPECT_THROW(rng.uniform(0), std::invalid_argument);
  // splitmix64-seeded xoshiro256**: the first outputs for seed 123, from an
  // independent Python transcription of the published algorithms.
  Rng a(123);
  EXPECT_EQ(a.next(), 0x325a8fa1d1a069f9ull);
  EXPECT_EQ(a.next(), 0xf835e3c7656d4d5eull);
  EXPECT_EQ(a.next(), 0x77aa2b46c3f2a62full);
}

TEST(TrainData, Fnv1a64MatchesPublishedValues) {
  const std::string a = "a", foobar = "foobar";
  EXPECT_EQ(fnv1a64({}), 0xcbf29ce484222325ull);
  EXPECT_EQ(fnv1a64(std::span(reinterpret_cast<const uint8_t*>(a.data()), a.size())), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(fnv1a64(std::span(reinterpret_cast<const uint8_t*>(foobar.data()), foobar.size())), 0x85944171f73967e8ull);
}

}  // namespace
