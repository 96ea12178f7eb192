"""Fine-tune a DeBERTa-v3-style sequence classifier whose attention relpos computes, with the
config's attention dropout in training.

    .venv/bin/python examples/deberta_finetune.py                        # a tiny DeBERTa-v3-style model
    .venv/bin/python examples/deberta_finetune.py --model DIR            # a local checkpoint and its tokenizer
    .venv/bin/python examples/deberta_finetune.py --save DIR             # keep the fine-tuned model

The model is transformers' DebertaV2ForSequenceClassification, trained as one would train it
unpatched: ``rt.patch_hf_deberta(model)`` swaps each DisentangledSelfAttention's forward for
relpos's (the c2p and p2c terms from the (H, 2 span, d) position tables inside the fused
kernel, no (B H, L, L) score or gather tensors), and ``model.train()`` applies the config's
``attention_probs_dropout_prob`` through relpos's dropout (its masks drawn from torch's
generator: ``--seed`` repeats a run), ``hidden_dropout_prob`` as transformers applies it.
AdamW, linear warmup and decay, gradient clipping; accuracy on held-out sentences in eval mode.

The task is a toy sentiment one: sentences of 4 to 16 words, positive when they hold more
positive words than negative ones, padded per batch. Without ``--model`` the tokenizer is a
word-level one over those words and the model a tiny DeBERTa-v3 configuration (relative
attention with log buckets, c2p and p2c on shared keys, normalised relative embeddings, no
absolute positions) from random weights; ``--model`` loads a checkpoint directory such as
DeBERTa-v3's (``from_pretrained``, local files only) with its tokenizer and a new 2-label head.
"""
from __future__ import annotations

import argparse
import json
import random

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import (AutoTokenizer, DebertaV2Config, DebertaV2ForSequenceClassification,
                          PreTrainedTokenizerFast, get_linear_schedule_with_warmup)

import relpos.torch as rt

POSITIVE = ["good", "great", "fine", "nice", "superb", "lovely"]
NEGATIVE = ["bad", "poor", "awful", "dull", "weak", "boring"]
NEUTRAL = ["the", "a", "movie", "plot", "was", "and", "very", "story", "actors", "music", "it", "but"]
SPECIAL = ["[PAD]", "[CLS]", "[SEP]", "[UNK]"]


def sentences(n: int, rng: random.Random) -> tuple[list[str], list[int]]:
    """n sentences and their labels (1: more positive than negative words; no ties)."""
    texts, labels = [], []
    while len(texts) < n:
        words = [rng.choice(rng.choice((POSITIVE, NEGATIVE, NEUTRAL, NEUTRAL))) for _ in range(rng.randint(4, 16))]
        score = sum(w in POSITIVE for w in words) - sum(w in NEGATIVE for w in words)
        if score:
            texts.append(" ".join(words))
            labels.append(int(score > 0))
    return texts, labels


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer over the task's words, [CLS] sentence [SEP]."""
    vocab = {w: i for i, w in enumerate(SPECIAL + POSITIVE + NEGATIVE + NEUTRAL)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]", unk_token="[UNK]")


def tiny_model(vocab_size: int, args) -> DebertaV2ForSequenceClassification:
    """DeBERTa-v3-base's attention configuration at a tiny width."""
    config = DebertaV2Config(vocab_size=vocab_size, hidden_size=args.hidden, num_hidden_layers=args.layers,
                             num_attention_heads=args.heads, intermediate_size=2 * args.hidden,
                             max_position_embeddings=512, relative_attention=True, position_buckets=256,
                             max_relative_positions=-1, pos_att_type=["p2c", "c2p"], share_att_key=True,
                             norm_rel_ebd="layer_norm", position_biased_input=False, type_vocab_size=0,
                             hidden_dropout_prob=args.dropout, attention_probs_dropout_prob=args.dropout,
                             num_labels=2)
    return DebertaV2ForSequenceClassification(config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a local DeBERTa-v2/v3 checkpoint directory (default: a tiny model)")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-3, help="for the tiny model; ~2e-5 for a checkpoint")
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--dropout", type=float, default=0.1, help="the tiny model's attention and hidden dropout")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="cuda: relpos.gpu's kernels")
    parser.add_argument("--no-patch", action="store_true", help="train with transformers' own attention")
    parser.add_argument("--save", help="a directory to save the fine-tuned model and tokenizer in")
    parser.add_argument("--json", help="write the losses and the accuracy to this file")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    data = random.Random(args.seed)
    if args.model:
        tokenizer = AutoTokenizer.from_pretrained(args.model, local_files_only=True)
        model = DebertaV2ForSequenceClassification.from_pretrained(args.model, num_labels=2, local_files_only=True)
    else:
        tokenizer = tiny_tokenizer()
        model = tiny_model(len(tokenizer), args)
    if not args.no_patch:
        rt.patch_hf_deberta(model)
    model.to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    schedule = get_linear_schedule_with_warmup(optimizer, args.steps // 10, args.steps)

    model.train()  # attention_probs_dropout_prob applies, through relpos
    losses = []
    for step in range(args.steps):
        texts, labels = sentences(args.batch, data)
        batch = tokenizer(texts, padding=True, return_tensors="pt").to(args.device)
        loss = model(**batch, labels=torch.tensor(labels, device=args.device)).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        if step % 20 == 0 or step == args.steps - 1:
            print(f"step {step:4d}  loss {loss.item():.4f}")

    model.eval()  # no dropout
    texts, labels = sentences(256, random.Random(args.seed + 1))
    with torch.no_grad():
        predicted = model(**tokenizer(texts, padding=True, return_tensors="pt").to(args.device)).logits.argmax(-1)
    accuracy = (predicted.cpu() == torch.tensor(labels)).float().mean().item()
    print(f"held-out accuracy {accuracy:.3f}")
    if args.save:
        model.save_pretrained(args.save)
        tokenizer.save_pretrained(args.save)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"losses": losses, "accuracy": accuracy, "patched": not args.no_patch,
                       "attention_dropout": model.config.attention_probs_dropout_prob}, f)


if __name__ == "__main__":
    main()
