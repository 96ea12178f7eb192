#include "relpos/train/checkpoint.hpp"

#include "relpos/train/files.hpp"
#include "relpos/train/trainer.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace relpos::train {

static_assert(std::endian::native == std::endian::little, "checkpoints are written in the host's (little-endian) order");

namespace {

constexpr char kMagic[8] = {'R', 'E', 'L', 'P', 'O', 'S', 'C', 'K'};
constexpr size_t kHeaderBytes = 8 + 4 + 4 + 8 + 8;

class Writer {
 public:
  template <class T>
  void put(const T& value) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const uint8_t*>(&value);
    bytes.insert(bytes.end(), p, p + sizeof(T));
  }
  void put_string(const std::string& s) {
    put(uint64_t(s.size()));
    bytes.insert(bytes.end(), s.begin(), s.end());
  }
  void put_floats(const std::vector<float>& v) {
    put(uint64_t(v.size()));
    const auto* p = reinterpret_cast<const uint8_t*>(v.data());
    bytes.insert(bytes.end(), p, p + v.size() * sizeof(float));
  }
  std::vector<uint8_t> bytes;
};

// Reads the payload; every read checks the remaining size, so a damaged
// length field is an error, never an overrun or a huge allocation.
class Reader {
 public:
  Reader(std::span<const uint8_t> bytes, const std::string& path) : bytes_(bytes), path_(path) {}
  template <class T>
  T get() {
    T value;
    std::memcpy(&value, take(sizeof(T)).data(), sizeof(T));
    return value;
  }
  std::string get_string() {
    const auto s = take(get_count(1));
    return std::string(s.begin(), s.end());
  }
  std::vector<float> get_floats() {
    const uint64_t n = get_count(sizeof(float));
    std::vector<float> v(n);
    std::memcpy(v.data(), take(n * sizeof(float)).data(), n * sizeof(float));
    return v;
  }
  bool at_end() const { return pos_ == bytes_.size(); }

 private:
  uint64_t get_count(size_t element) {
    const uint64_t n = get<uint64_t>();
    if (n > (bytes_.size() - pos_) / element) fail();
    return n;
  }
  std::span<const uint8_t> take(size_t n) {
    if (n > bytes_.size() - pos_) fail();
    const auto s = bytes_.subspan(pos_, n);
    pos_ += n;
    return s;
  }
  [[noreturn]] void fail() const {
    throw std::runtime_error("checkpoint '" + path_ + "' is malformed: a field runs past the end of its payload");
  }
  std::span<const uint8_t> bytes_;
  std::string path_;
  size_t pos_ = 0;
};

std::runtime_error io_error(const std::string& what, const std::string& path) {
  return std::runtime_error(what + " '" + path + "': " + std::strerror(errno));
}

size_t line_of(const std::string& text, const std::string& key) {  // where a "key=" line starts, or npos
  if (text.starts_with(key)) return 0;
  const size_t at = text.find("\n" + key);
  return at == std::string::npos ? at : at + 1;
}

// Checkpoints of relpos versions that kept the Transformer-XL memory in the
// model's configuration carry an "xl_memory=" line in the model's text: moved
// to the training text, where TrainConfig reads it, so that they load and resume.
void move_xl_memory_to_training(Checkpoint& c) {
  const std::string key = "xl_memory=";
  const size_t at = line_of(c.model_config, key);
  if (at == std::string::npos) return;
  const size_t newline = c.model_config.find('\n', at);
  const size_t end = newline == std::string::npos ? c.model_config.size() : newline + 1;
  std::string line = c.model_config.substr(at, end - at);
  c.model_config.erase(at, end - at);
  if (!line.ends_with('\n')) line += '\n';
  if (line_of(c.train_config, key) != std::string::npos) return;
  if (!c.train_config.empty() && !c.train_config.ends_with('\n')) c.train_config += '\n';
  c.train_config += line;
}

}  // namespace

void save_checkpoint(const std::string& path, const Checkpoint& c) {
  if (c.adam_m.size() != c.parameters.size() || c.adam_v.size() != c.parameters.size())
    throw std::invalid_argument("checkpoint: optimizer moments and parameters differ in size");
  Writer payload;
  payload.put_string(c.model_config);
  payload.put_string(c.train_config);
  payload.put_string(c.data_source);
  payload.put(c.data_bytes);
  payload.put(c.data_hash);
  payload.put(c.step);
  payload.put_floats(c.parameters);
  payload.put(c.adam_steps);
  payload.put_floats(c.adam_m);
  payload.put_floats(c.adam_v);
  payload.put(c.sampler.rng);
  payload.put(c.sampler.cursor);
  payload.put(uint8_t(c.has_memory));
  if (c.has_memory) {
    const nn::KVCache& m = c.memory;
    if (m.keys.size() != m.values.size()) throw std::invalid_argument("checkpoint: memory keys and values differ");
    payload.put(int32_t(m.batch));
    payload.put(int32_t(m.capacity));
    payload.put(int32_t(m.length));
    payload.put(m.position);
    payload.put(uint64_t(m.keys.size()));
    for (size_t l = 0; l < m.keys.size(); ++l) {
      payload.put_floats(m.keys[l]);
      payload.put_floats(m.values[l]);
    }
  }
  Writer file;
  file.bytes.insert(file.bytes.end(), kMagic, kMagic + 8);
  file.put(kCheckpointVersion);
  file.put(uint32_t(0));
  file.put(uint64_t(payload.bytes.size()));
  file.put(fnv1a64(payload.bytes));
  file.bytes.insert(file.bytes.end(), payload.bytes.begin(), payload.bytes.end());
  write_file_atomic(path, file.bytes);
}

Checkpoint load_checkpoint(const std::string& path) {
  if (std::filesystem::is_directory(path))
    throw std::runtime_error("checkpoint '" + path + "' is a folder, not a checkpoint file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw io_error("cannot open checkpoint", path);
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw io_error("cannot read checkpoint", path);
  const std::string name = "checkpoint '" + path + "'";
  if (bytes.size() < 8 || std::memcmp(bytes.data(), kMagic, 8) != 0)
    throw std::runtime_error(name + " is not a relpos checkpoint (wrong magic)");
  if (bytes.size() < kHeaderBytes) throw std::runtime_error(name + " is truncated (incomplete header)");
  Reader header(std::span<const uint8_t>(bytes).first(kHeaderBytes).subspan(8), path);
  const auto version = header.get<uint32_t>();
  header.get<uint32_t>();
  const auto payload_size = header.get<uint64_t>();
  const auto checksum = header.get<uint64_t>();
  if (version != kCheckpointVersion)
    throw std::runtime_error(name + " has format version " + std::to_string(version) + "; this build reads version " +
                             std::to_string(kCheckpointVersion));
  if (bytes.size() - kHeaderBytes < payload_size)
    throw std::runtime_error(name + " is truncated: " + std::to_string(bytes.size() - kHeaderBytes) + " of " +
                             std::to_string(payload_size) + " payload bytes");
  if (bytes.size() - kHeaderBytes > payload_size)
    throw std::runtime_error(name + " has " + std::to_string(bytes.size() - kHeaderBytes - payload_size) +
                             " unexpected bytes after its payload");
  const auto payload = std::span<const uint8_t>(bytes).subspan(kHeaderBytes);
  if (fnv1a64(payload) != checksum) throw std::runtime_error(name + " is corrupt (checksum mismatch)");

  Reader r(payload, path);
  Checkpoint c;
  c.model_config = r.get_string();
  c.train_config = r.get_string();
  c.data_source = r.get_string();
  c.data_bytes = r.get<int64_t>();
  c.data_hash = r.get<uint64_t>();
  c.step = r.get<int64_t>();
  c.parameters = r.get_floats();
  c.adam_steps = r.get<int64_t>();
  c.adam_m = r.get_floats();
  c.adam_v = r.get_floats();
  c.sampler.rng = r.get<std::array<uint64_t, 4>>();
  c.sampler.cursor = r.get<int64_t>();
  c.has_memory = r.get<uint8_t>() != 0;
  if (c.has_memory) {
    nn::KVCache& m = c.memory;
    m.batch = r.get<int32_t>();
    m.capacity = r.get<int32_t>();
    m.length = r.get<int32_t>();
    m.position = r.get<int64_t>();
    const auto layers = r.get<uint64_t>();
    if (layers > payload.size()) throw std::runtime_error(name + " is malformed (memory layer count)");
    for (uint64_t l = 0; l < layers; ++l) {
      m.keys.push_back(r.get_floats());
      m.values.push_back(r.get_floats());
    }
  }
  if (!r.at_end()) throw std::runtime_error(name + " is malformed (unread bytes at the end of its payload)");
  if (c.adam_m.size() != c.parameters.size() || c.adam_v.size() != c.parameters.size())
    throw std::runtime_error(name + " is malformed (optimizer moments and parameters differ in size)");
  move_xl_memory_to_training(c);
  return c;
}

nn::Model model_from_checkpoint(const Checkpoint& c) {
  nn::Model model(nn::ModelConfig::from_text(c.model_config));
  if (model.parameters().size() != c.parameters.size())
    throw std::runtime_error("checkpoint holds " + std::to_string(c.parameters.size()) +
                             " parameters, its model configuration needs " + std::to_string(model.parameters().size()));
  std::copy(c.parameters.begin(), c.parameters.end(), model.parameters().begin());
  model.precision = TrainConfig::from_text(c.train_config).precision;
  return model;
}

}  // namespace relpos::train
