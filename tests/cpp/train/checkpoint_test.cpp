// Checkpoints: round trip, refusal of damaged or foreign files, atomic
// writes, and resume refusing a different configuration or data.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <csignal>
#include <cstring>

#include "relpos/train/checkpoint.hpp"
#include "relpos/train/trainer.hpp"
#include "train/test_files.hpp"

namespace {

using namespace relpos::train;
using relpos::nn::ModelConfig;
using relpos::nn::PositionKind;
using relpos_train_test::read_bytes;
using relpos_train_test::TempDir;
using relpos_train_test::write_bytes;

ModelConfig tiny_model(PositionKind position) {
  ModelConfig m;
  m.layers = 1, m.width = 16, m.heads = 2, m.ffn = 32, m.context = 8, m.position = position;
  m.scheme_options["shaw_k"] = 4;
  m.scheme_options["t5_buckets"] = 8, m.scheme_options["t5_max_distance"] = 16;
  return m;
}

TrainConfig tiny_training() {
  TrainConfig t;
  t.steps = 6, t.batch = 3, t.warmup = 2, t.lr = 1e-2;
  return t;
}

std::string load_error(const std::string& path) {
  try {
    load_checkpoint(path);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

TEST(TrainCheckpoint, RoundTripKeepsEveryField) {
  TempDir dir;
  const auto data = relpos_train_test::sample_text(400);
  Trainer trainer(tiny_model("xl"), tiny_training(), data, "sample");
  trainer.set_threads(1);
  for (int i = 0; i < 3; ++i) trainer.step();
  const Checkpoint a = trainer.checkpoint();
  ASSERT_TRUE(a.has_memory);
  ASSERT_GT(a.memory.length, 0);
  save_checkpoint(dir.file("a.ckpt"), a);
  const Checkpoint b = load_checkpoint(dir.file("a.ckpt"));
  EXPECT_EQ(b.model_config, a.model_config);
  EXPECT_EQ(b.train_config, a.train_config);
  EXPECT_EQ(b.data_source, "sample");
  EXPECT_EQ(b.data_bytes, 400);
  EXPECT_EQ(b.data_hash, a.data_hash);
  EXPECT_EQ(b.step, 3);
  EXPECT_EQ(b.parameters, a.parameters);
  EXPECT_EQ(b.adam_steps, 3);
  EXPECT_EQ(b.adam_m, a.adam_m);
  EXPECT_EQ(b.adam_v, a.adam_v);
  EXPECT_EQ(b.sampler.rng, a.sampler.rng);
  EXPECT_EQ(b.sampler.cursor, a.sampler.cursor);
  EXPECT_EQ(b.memory.batch, a.memory.batch);
  EXPECT_EQ(b.memory.capacity, a.memory.capacity);
  EXPECT_EQ(b.memory.length, a.memory.length);
  EXPECT_EQ(b.memory.position, a.memory.position);
  EXPECT_EQ(b.memory.keys, a.memory.keys);
  EXPECT_EQ(b.memory.values, a.memory.values);
  // The model rebuilt from the file has the trained parameters.
  const auto model = model_from_checkpoint(b);
  EXPECT_TRUE(std::equal(model.parameters().begin(), model.parameters().end(), a.parameters.begin()));
}

class DamagedCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto data = relpos_train_test::sample_text(300);
    Trainer trainer(tiny_model("alibi"), tiny_training(), data);
    trainer.step();
    trainer.save(dir.file("good.ckpt"));
    good = read_bytes(dir.file("good.ckpt"));
    ASSERT_GT(good.size(), 100u);
  }
  std::string refusal(const std::vector<uint8_t>& bytes) {
    write_bytes(dir.file("bad.ckpt"), bytes);
    return load_error(dir.file("bad.ckpt"));
  }
  TempDir dir;
  std::vector<uint8_t> good;
};

TEST_F(DamagedCheckpoint, FlippedPayloadByteFailsTheChecksum) {
  for (size_t at : {size_t(40), good.size() / 2, good.size() - 1}) {
    auto bad = good;
    bad[at] ^= 0x10;
    EXPECT_NE(refusal(bad).find("checksum"), std::string::npos) << "byte " << at;
  }
}

TEST_F(DamagedCheckpoint, TruncatedFileIsRefused) {
  for (size_t keep : {size_t(0), size_t(5), size_t(20), good.size() / 2, good.size() - 1}) {
    const std::string why = refusal({good.begin(), good.begin() + int64_t(keep)});
    EXPECT_TRUE(why.find("truncated") != std::string::npos || why.find("wrong magic") != std::string::npos)
        << keep << ": " << why;
  }
  auto longer = good;
  longer.push_back(0);
  EXPECT_NE(refusal(longer).find("unexpected bytes"), std::string::npos);
}

TEST_F(DamagedCheckpoint, WrongMagicAndVersionAreRefused) {
  auto bad = good;
  bad[0] = 'X';
  EXPECT_NE(refusal(bad).find("not a relpos checkpoint"), std::string::npos);
  bad = good;
  bad[8] = uint8_t(kCheckpointVersion + 1);
  EXPECT_NE(refusal(bad).find("version " + std::to_string(kCheckpointVersion + 1)), std::string::npos);
  EXPECT_NE(load_error(dir.file("missing.ckpt")).find("cannot open"), std::string::npos);
}

TEST_F(DamagedCheckpoint, ALengthFieldPastThePayloadIsRefusedWithAValidChecksum) {
  // A payload whose first string claims more bytes than exist, with a correct
  // checksum: the reader must stop at the payload's end, not trust the field.
  std::vector<uint8_t> payload(16, 0);
  const uint64_t huge = 1ull << 40;
  std::memcpy(payload.data(), &huge, 8);
  // Header: magic and version (+ reserved) from a good file, then size and checksum.
  std::vector<uint8_t> file(good.begin(), good.begin() + 16);
  const uint64_t size = payload.size(), sum = fnv1a64(payload);
  const auto append = [&](const auto& v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    file.insert(file.end(), p, p + sizeof v);
  };
  append(size);
  append(sum);
  file.insert(file.end(), payload.begin(), payload.end());
  EXPECT_NE(refusal(file).find("malformed"), std::string::npos);
}

TEST(TrainCheckpoint, FailedWriteLeavesTheOldFileAndNoTemporary) {
  TempDir dir;
  const std::string path = dir.file("run.ckpt");
  const std::vector<uint8_t> old_bytes = {'o', 'l', 'd'};
  write_bytes(path, old_bytes);
  const auto data = relpos_train_test::sample_text(300);
  Trainer trainer(tiny_model("rope"), tiny_training(), data);
  // A file-size limit below the checkpoint's size makes write() fail midway
  // (EFBIG; SIGXFSZ ignored so the process survives), as a full disk would.
  struct sigaction ignore {}, previous{};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGXFSZ, &ignore, &previous);
  rlimit saved{};
  getrlimit(RLIMIT_FSIZE, &saved);
  rlimit small = saved;
  small.rlim_cur = 64;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string error;
  try {
    trainer.save(path);
  } catch (const std::runtime_error& e) {
    error = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &saved);
  sigaction(SIGXFSZ, &previous, nullptr);
  EXPECT_NE(error.find("cannot write"), std::string::npos) << error;
  EXPECT_EQ(read_bytes(path), old_bytes);
  size_t entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) entries += e.exists();
  EXPECT_EQ(entries, 1u);  // the temporary file was removed
  // Without the limit the same save replaces the file.
  trainer.save(path);
  EXPECT_EQ(load_checkpoint(path).parameters.size(), trainer.model().parameters().size());
}

TEST(TrainCheckpoint, ResumeRefusesOtherConfigurationsAndData) {
  TempDir dir;
  const auto data = relpos_train_test::sample_text(300);
  Trainer trainer(tiny_model("t5"), tiny_training(), data);
  trainer.step();
  trainer.save(dir.file("t5.ckpt"));
  const auto resume_error = [&](const ModelConfig& m, const TrainConfig& t, const std::vector<uint8_t>& d) {
    Trainer other(m, t, d);
    try {
      other.resume(dir.file("t5.ckpt"));
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  ModelConfig wider = tiny_model("t5");
  wider.width = 32;
  EXPECT_NE(resume_error(wider, tiny_training(), data).find("width: 16 in the checkpoint, 32 requested"),
            std::string::npos);
  EXPECT_NE(resume_error(tiny_model("alibi"), tiny_training(), data).find("model configuration differs"),
            std::string::npos);
  TrainConfig faster = tiny_training();
  faster.lr = 0.5;
  EXPECT_NE(resume_error(tiny_model("t5"), faster, data).find("training configuration differs (lr"),
            std::string::npos);
  auto other_data = data;
  other_data[7] ^= 1;
  EXPECT_NE(resume_error(tiny_model("t5"), tiny_training(), other_data).find("other data"),
            std::string::npos);
  EXPECT_EQ(resume_error(tiny_model("t5"), tiny_training(), data), "");
}

// A checkpoint whose model text holds the Transformer-XL memory (where relpos
// kept it before it became a training setting) loads with the line moved to the
// training text, and resumes with the same memory.
TEST(TrainCheckpoint, XlMemoryInTheModelTextMovesToTheTrainingText) {
  TempDir dir;
  const auto data = relpos_train_test::sample_text(400);
  TrainConfig training = tiny_training();
  training.xl_memory = 7;
  Trainer trainer(tiny_model("xl"), training, data, "sample");
  trainer.set_threads(1);
  trainer.step();
  Checkpoint old = trainer.checkpoint();
  const size_t at = old.train_config.find("xl_memory=7\n");
  ASSERT_NE(at, std::string::npos);
  old.train_config.erase(at, std::string("xl_memory=7\n").size());
  old.model_config = "xl_memory=7\n" + old.model_config;
  save_checkpoint(dir.file("old.ckpt"), old);
  const Checkpoint loaded = load_checkpoint(dir.file("old.ckpt"));
  EXPECT_EQ(loaded.model_config, trainer.checkpoint().model_config);
  EXPECT_EQ(TrainConfig::from_text(loaded.train_config).xl_memory, 7);
  Trainer resumed(tiny_model("xl"), training, data, "sample");
  EXPECT_NO_THROW(resumed.resume(loaded));
  EXPECT_EQ(resumed.checkpoint().memory.capacity, 7);
}

TEST(TrainCheckpoint, TrainConfigTextRoundTrips) {
  TrainConfig t;
  t.lr = 0.1 + 0.2;  // not exactly representable in few digits
  t.seed = 18446744073709551615ull;
  t.clip = 0;
  t.xl_memory = 17;
  const TrainConfig back = TrainConfig::from_text(t.to_text());
  EXPECT_EQ(back.to_text(), t.to_text());
  EXPECT_EQ(back.lr, t.lr);
  EXPECT_EQ(back.seed, t.seed);
  EXPECT_EQ(back.xl_memory, 17);
  EXPECT_THROW(TrainConfig::from_text("xl_memory=-2\n"), std::invalid_argument);
  EXPECT_THROW(TrainConfig::from_text("xl_memory=16777217\n"), std::invalid_argument);
  EXPECT_THROW(TrainConfig::from_text("steps=5\nspeed=3\n"), std::invalid_argument);
  EXPECT_THROW(TrainConfig::from_text("steps=five\n"), std::invalid_argument);
  EXPECT_THROW(TrainConfig::from_text("steps=0\n"), std::invalid_argument);
}

}  // namespace
