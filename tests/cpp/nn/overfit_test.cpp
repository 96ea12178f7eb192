// End to end: a tiny model memorises a 2 KB English text with 500 Adam
// steps (a minimal Adam written here; the trainer has its own AdamW).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "relpos/nn/model.hpp"

using namespace relpos::nn;

namespace {

const std::string kText =
    "It was a bright cold day in April, and the clocks were striking thirteen. The hallway smelt of boiled "
    "cabbage and old rag mats. At one end of it a coloured poster, too large for indoor display, had been tacked "
    "to the wall. It depicted simply an enormous face, more than a metre wide: the face of a man of about "
    "forty-five, with a heavy black moustache and ruggedly handsome features. Outside, even through the shut "
    "window-pane, the world looked cold. Down in the street little eddies of wind were whirling dust and torn "
    "paper into spirals, and though the sun was shining and the sky a harsh blue, there seemed to be no colour in "
    "anything, except the posters that were plastered everywhere. The river ran slowly past the mill, carrying "
    "leaves and small branches toward the sea, and the miller watched it every morning from his window while the "
    "bread rose in the warm kitchen behind him. Children came down the lane with baskets of apples, singing the "
    "old songs their grandmothers had taught them, and the dogs of the village followed them as far as the "
    "bridge, where they stopped, barked twice, and turned back home. In the evening the lamps were lit one by "
    "one along the harbour wall, the fishing boats came in with the tide, and the men carried their nets up the "
    "stone steps to dry. Nobody in the village could remember a winter as long as that one: the snow lay on the "
    "hills until May, the well froze twice, and the schoolmaster read to the children by candlelight because the "
    "oil had run out in February. When spring finally came it came all at once, in a single warm week, and the "
    "whole valley turned green as if someone had painted it overnight. The old woman who kept the bees said she "
    "had never seen so many flowers, and she sold her honey at the market for twice the usual price. Travellers "
    "who passed through that summer wrote letters home about the quiet roads, the clear water and the kindness "
    "of strangers, and some of them never left. The innkeeper added three rooms to the back of the house and "
    "painted a new sign above the door, a golden bee on a blue field, which hangs there to this day.";

struct Adam {
  std::vector<float> m, v;
  int step = 0;
  void update(std::span<float> params, std::span<const float> grads, float lr) {
    const float b1 = 0.9f, b2 = 0.99f, eps = 1e-8f;
    if (m.empty()) m.assign(params.size(), 0.0f), v.assign(params.size(), 0.0f);
    ++step;
    const float c1 = 1 - std::pow(b1, float(step)), c2 = 1 - std::pow(b2, float(step));
    for (std::size_t i = 0; i < params.size(); ++i) {
      m[i] = b1 * m[i] + (1 - b1) * grads[i];
      v[i] = b2 * v[i] + (1 - b2) * grads[i] * grads[i];
      params[i] -= lr * (m[i] / c1) / (std::sqrt(v[i] / c2) + eps);
    }
  }
};

}  // namespace

TEST(NnOverfit, TinyModelMemorisesTwoKilobytes) {
  ASSERT_GE(kText.size(), 2000u);
  ModelConfig c;
  c.layers = 2, c.width = 64, c.heads = 4, c.ffn = 256, c.context = 32, c.position = "rope", c.seed = 5;
  Model m(c);
  m.num_threads = 1;
  const int batch = 16, length = 32, steps = 500;
  std::mt19937 gen(9);
  std::uniform_int_distribution<std::size_t> start(0, kText.size() - length - 1);
  std::vector<uint8_t> tokens(batch * (length + 1));
  Adam adam;
  float first = 0, last = 0;
  for (int s = 0; s < steps; ++s) {
    for (int b = 0; b < batch; ++b) {
      const std::size_t at = start(gen);
      for (int i = 0; i <= length; ++i) tokens[b * (length + 1) + i] = static_cast<uint8_t>(kText[at + i]);
    }
    m.zero_gradients();
    const float loss = m.forward_backward(tokens, batch, length);
    ASSERT_TRUE(std::isfinite(loss)) << "step " << s;
    if (s == 0) first = loss;
    last = loss;
    adam.update(m.parameters(), m.gradients(), 2e-3f * std::min(1.0f, (s + 1) / 20.0f));
  }
  // Whole text in windows, scored on every position after the first 8.
  const int windows = static_cast<int>((kText.size() - 1) / length);
  std::vector<uint8_t> all(windows * (length + 1));
  for (int w = 0; w < windows; ++w)
    for (int i = 0; i <= length; ++i) all[w * (length + 1) + i] = static_cast<uint8_t>(kText[w * length + i]);
  const float eval = m.loss(all, windows, length, nullptr, 8);
  RecordProperty("final_train_loss", std::to_string(last));
  RecordProperty("eval_loss", std::to_string(eval));
  std::printf("first loss %.3f, last %.3f, whole text %.3f nats/byte\n", first, last, eval);
  EXPECT_GT(first, 5.0f);
  // Byte frequencies alone cost about 2.9 nats/byte on this text; below 1 the
  // model recalls what follows from the context.
  EXPECT_LT(eval, 1.0f);
}
