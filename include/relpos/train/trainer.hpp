// The training loop of the byte-level language models: batches from a
// BatchSampler, Model::forward_backward, global-norm clipping, AdamW under a
// warmup + cosine schedule, and checkpoints that resume the exact run.
// The training length is the model's context (ModelConfig::context).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "relpos/nn/model.hpp"
#include "relpos/train/checkpoint.hpp"
#include "relpos/train/data.hpp"
#include "relpos/train/optimizer.hpp"

namespace relpos::train {

inline constexpr int kMaxXlMemory = 1 << 24;  // the largest TrainConfig::xl_memory

struct TrainConfig {
  int64_t steps = 1000;
  int64_t batch = 16;
  double lr = 3e-3;           // peak learning rate
  double min_lr_ratio = 0.1;  // the cosine ends at min_lr_ratio * lr
  int64_t warmup = 100;
  double weight_decay = 0.1;
  double beta1 = 0.9, beta2 = 0.99;
  double clip = 1.0;  // global gradient-norm limit; 0 = no clipping
  uint64_t seed = 1;  // batch sampling (the model's initialisation has its own seed)
  // Mixed precision (nn::Precision); parameters, optimizer state and
  // checkpoints stay float32. Part of the run: a resume must ask for the same.
  nn::Precision precision = nn::Precision::float32;
  // Transformer-XL: keys of memory carried from batch to batch (0 = the model's
  // context). A setting of the run, not of the model: evaluation and sampling
  // choose their own. Other schemes carry no memory and ignore it.
  int xl_memory = 0;
  // Attention dropout, in [0, 1): the probability that a training step drops
  // an attention weight (nn::TrainingDropout: masks keyed by `seed` and the
  // step, so a resumed run draws the same ones). Evaluation, sampling and the
  // validation score never drop. A setting of the run, like xl_memory; a
  // checkpoint without it trained without dropout.
  double attention_dropout = 0;

  void validate() const;        // throws std::invalid_argument naming the field
  std::string to_text() const;  // "key=value" lines; round-trips through from_text
  static TrainConfig from_text(const std::string& text);
};

// Describes in one line where two "key=value" texts differ ("" if equal):
// "lr: 0.003 in the checkpoint, 0.001 requested".
std::string config_difference(const std::string& stored, const std::string& requested);

class Trainer {
 public:
  // `train_data` must outlive the trainer. Transformer-XL models read it as
  // contiguous streams and carry their memory from batch to batch; every
  // other model reads windows at random positions.
  Trainer(const nn::ModelConfig& model, const TrainConfig& config, std::span<const uint8_t> train_data,
          std::string data_source = "");

  // One optimizer step; returns the batch's loss (nats per byte, with the
  // step's attention dropout) before the update. Throws std::runtime_error if
  // the loss is not finite.
  float step();
  bool done() const { return step_ >= config_.steps; }
  int64_t steps_taken() const { return step_; }

  // Checkpoints. resume() restores a checkpoint written by a trainer with the
  // same model configuration, training configuration and training data, and
  // throws std::runtime_error naming the first difference otherwise. The step
  // count may be larger than the checkpoint's (a finished run extended): the
  // warmup + cosine schedule is then the one over the new count, from the
  // checkpoint's step on.
  Checkpoint checkpoint() const;
  void save(const std::string& path) const { save_checkpoint(path, checkpoint()); }
  void resume(const Checkpoint& checkpoint);
  void resume(const std::string& path) { resume(load_checkpoint(path)); }

  nn::Model& model() { return model_; }
  int length() const { return model_.config().context; }
  void set_threads(int n);  // model and optimizer; 0 = all
  double last_lr() const { return last_lr_; }
  double last_grad_norm() const { return last_grad_norm_; }

 private:
  bool uses_memory() const { return model_.config().position == "xl"; }
  int memory_capacity() const;

  TrainConfig config_;
  nn::Model model_;
  AdamW optimizer_;
  std::span<const uint8_t> data_;
  std::string data_source_;
  uint64_t data_hash_;
  BatchSampler sampler_;
  nn::KVCache memory_;
  std::vector<uint8_t> tokens_;
  int64_t step_ = 0;
  double last_lr_ = 0, last_grad_norm_ = 0;
};

}  // namespace relpos::train
