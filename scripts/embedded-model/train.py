#!/usr/bin/env python3
"""Trains the embedded default model of `pagedattn generate` (models/austen-3m/) from scratch.

Pipeline, all in one run:
  1. text: the six Austen novels as exported by export-austen.sh; 1% of each novel's paragraphs
     (a block at its middle) held out for validation; a few chat conversations made from the
     training dialogue (corpus.py);
  2. tokenizer: byte-level BPE (Hugging Face `tokenizers`) trained on the training text only, the
     Llama-3 split regex, ByteLevel pre-tokenizer and decoder, special tokens <|endoftext|> (bos,
     eos, pad), <|user|>, <|assistant|>; tokenizer_config.json with the chat template;
  3. model: a LlamaForCausalLM (transformers) small enough that the whole directory stays under
     --max-dir-bytes (checked before training): tied embeddings, grouped-query attention;
  4. training: random windows of --context tokens from the training token stream, AdamW, linear
     warm-up then cosine decay, bf16 autocast, residual dropout (forward hooks on o_proj and
     down_proj, so the saved model is a plain Llama), validation loss every --eval-every steps;
     the checkpoint with the best validation loss is the one kept;
  5. output (--out): the model directory as save_pretrained writes it (bf16 safetensors) plus the
     tokenizer files and the model card (README.md, with the figures of this run), reloaded with
     transformers' Auto classes to check it and to write greedy and temperature-0.8 samples
     (check_model.py); metrics.json, samples.json and samples.txt beside it.

`--dry-run` stops before anything needs torch or tokenizers: it prints the corpus split, the
parameter count and the size estimate, and writes a model card with placeholder figures.

Example: scripts/embedded-model/export-austen.sh /tmp/austen &&
         python3 scripts/embedded-model/train.py --text /tmp/austen --out /tmp/run
"""

import argparse
import json
import math
import pathlib
import platform
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import check_model  # noqa: E402
import corpus  # noqa: E402
import model_card  # noqa: E402

# The split regex of Llama 3 (and of tiktoken's cl100k): contractions, letter runs with one
# leading non-letter, numbers of up to 3 digits, punctuation runs, newlines, other whitespace.
SPLIT_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

def parse_arguments():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("--text", help="folder written by export-austen.sh")
    add("--out", help="output folder (the model goes to OUT/model)")
    add("--name", default="austen-3m", help="model name used in the card")
    add("--seed", type=int, default=0)
    add("--validation-fraction", type=float, default=0.01)
    add("--chat-fraction", type=float, default=0.1, help="chat text / training text (chars)")
    add("--vocab", type=int, default=4096)
    add("--hidden", type=int, default=256)
    add("--layers", type=int, default=4)
    add("--heads", type=int, default=4)
    add("--kv-heads", type=int, default=1)
    add("--head-dim", type=int, default=64)
    add("--intermediate", type=int, default=384)
    add("--context", type=int, default=512)
    add("--batch", type=int, default=32)
    add("--steps", type=int, default=3000)
    add("--warmup", type=int, default=200)
    add("--lr", type=float, default=2e-3)
    add("--min-lr-ratio", type=float, default=0.1)
    add("--weight-decay", type=float, default=0.1)
    add("--dropout", type=float, default=0.1, help="residual dropout (training only)")
    add("--eval-every", type=int, default=100)
    add("--max-seconds", type=float, default=0.0,
        help="cap on training time: if the measured step time says --steps will not fit, "
             "fewer steps are run (the cosine schedule is set for them)")
    add("--max-dir-bytes", type=int, default=6 * 1024 * 1024)
    add("--dry-run", action="store_true")
    add("--card-from", metavar="RUN_DIR",
        help="only write RUN_DIR/model/README.md again from RUN_DIR/metrics.json and "
             "samples.json (after a change to model_card.py)")
    args = parser.parse_args()
    if not args.card_from and not (args.text and args.out):
        parser.error("--text and --out are required (unless --card-from)")
    return parser, args


def reproduce_command(parser, args, steps_run):
    """The command that trains this model again: the arguments that differ from the defaults,
    with the steps this run made and no time cap (the step count was the cap's only effect)."""
    words = ["python3 scripts/embedded-model/train.py",
             "--text /tmp/austen-text --out /tmp/austen-run"]
    for name, value in vars(args).items():
        if name in ("text", "out", "max_seconds", "dry_run", "steps"):
            continue
        if value != parser.get_default(name):
            words.append(f"--{name.replace('_', '-')} {value}")
    if steps_run != parser.get_default("steps"):
        words.append(f"--steps {steps_run}")
    return " ".join(words)


def parameter_count(args):
    """Parameters of the Llama model these arguments describe (embeddings tied)."""
    attention = args.hidden * args.head_dim * (2 * args.heads + 2 * args.kv_heads)
    mlp = 3 * args.hidden * args.intermediate
    per_layer = attention + mlp + 2 * args.hidden
    return args.vocab * args.hidden + args.layers * per_layer + args.hidden


def llama_config(args):
    return dict(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, head_dim=args.head_dim,
        max_position_embeddings=args.context, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True, bos_token_id=0, eos_token_id=0, pad_token_id=0,
        attention_dropout=0.0, hidden_act="silu", initializer_range=0.02)


def train_tokenizer(args, texts, model_dir):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    tokenizer = Tokenizer(models.BPE(byte_fallback=False))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=args.vocab, min_frequency=2, show_progress=False,
        special_tokens=corpus.SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer=trainer)
    if tokenizer.get_vocab_size() > args.vocab:
        raise SystemExit(f"tokenizer: vocab {tokenizer.get_vocab_size()} > {args.vocab}")
    for index, token in enumerate(corpus.SPECIAL_TOKENS):
        assert tokenizer.token_to_id(token) == index, token
    tokenizer.save(str(model_dir / "tokenizer.json"))
    added = {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False, "special": True}
             for i, t in enumerate(corpus.SPECIAL_TOKENS)}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": corpus.END_OF_TEXT, "eos_token": corpus.END_OF_TEXT,
        "pad_token": corpus.END_OF_TEXT, "unk_token": None,
        "add_bos_token": False, "add_eos_token": False,
        "clean_up_tokenization_spaces": False, "model_max_length": args.context,
        "added_tokens_decoder": added, "chat_template": corpus.CHAT_TEMPLATE,
    }
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return tokenizer


def token_streams(tokenizer, data):
    """Training stream (novels then chats, each ending in <|endoftext|>) and validation stream."""
    eos = tokenizer.token_to_id(corpus.END_OF_TEXT)
    train, validation = [], []
    for text in data["train_texts"]:
        train += tokenizer.encode(text).ids + [eos]
    for text in data["chats"]:  # each already ends with <|endoftext|>
        train += tokenizer.encode(text).ids
    for text in data["validation_texts"]:
        validation += tokenizer.encode(text).ids + [eos]
    return train, validation


def learning_rate(args, step, total):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = min(1.0, (step - args.warmup) / max(1, total - args.warmup))
    low = args.lr * args.min_lr_ratio
    return low + 0.5 * (args.lr - low) * (1 + math.cos(math.pi * progress))


def evaluate(torch, model, windows, batch):
    """Mean next-token cross entropy (nats) over the rows of `windows` [N, context + 1]."""
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        for start in range(0, windows.shape[0], batch):
            chunk = windows[start:start + batch]
            logits = model(input_ids=chunk[:, :-1], use_cache=False).logits.float()
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), chunk[:, 1:].reshape(-1), reduction="sum")
            total += loss.item()
            count += chunk[:, 1:].numel()
    model.train()
    return total / count


def train(args, train_tokens, validation_tokens, log):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    device = "cuda"
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(LlamaConfig(**llama_config(args))).to(device)
    if model.lm_head.weight is not model.model.embed_tokens.weight:
        log("lm_head was not tied to embed_tokens after construction: tying it")
        model.lm_head.weight = model.model.embed_tokens.weight
    actual = sum(p.numel() for p in model.parameters())
    if actual != parameter_count(args):
        log(f"warning: {actual} parameters, the size estimate assumed {parameter_count(args)}")

    def residual_dropout(module, inputs, output):
        return torch.nn.functional.dropout(output, args.dropout, module.training)
    for layer in model.model.layers:
        layer.self_attn.o_proj.register_forward_hook(residual_dropout)
        layer.mlp.down_proj.register_forward_hook(residual_dropout)

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)

    data = torch.tensor(train_tokens, dtype=torch.long, device=device)
    validation = check_model.validation_windows(torch, validation_tokens, args.context, device)
    generator = torch.Generator(device=device).manual_seed(args.seed)
    fixed = torch.Generator(device=device).manual_seed(args.seed + 1)
    span = torch.arange(args.context + 1, device=device)
    train_sample = data[torch.randint(0, data.numel() - args.context - 1, (64,),
                                      generator=fixed, device=device)[:, None] + span]

    total_steps, best, history = args.steps, None, []
    model.train()
    torch.cuda.synchronize()
    start = time.time()
    step = 0
    while step < total_steps:
        offsets = torch.randint(0, data.numel() - args.context - 1, (args.batch,),
                                generator=generator, device=device)
        windows = data[offsets[:, None] + span]
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(args, step, total_steps)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=windows[:, :-1], use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(
            logits.float().reshape(-1, logits.shape[-1]), windows[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        step += 1
        if step in (20, 60) and args.max_seconds > 0:  # fit the schedule to the time cap
            torch.cuda.synchronize()
            if step == 20:
                step_20_time = time.time()
            else:
                per_step = (time.time() - step_20_time) / 40 * 1.1  # + evaluations
                left = args.max_seconds - (time.time() - start)
                if step + left / per_step < total_steps:
                    total_steps = max(step + 1, int(step + left / per_step))
                    log(f"step time {per_step * 1000:.1f} ms: {total_steps} steps fit in "
                        f"{args.max_seconds:.0f} s (asked {args.steps})")
        if step % args.eval_every == 0 or step == total_steps:
            validation_loss = evaluate(torch, model, validation, args.batch)
            elapsed = time.time() - start
            history.append({"step": step, "train_batch_loss": round(loss.item(), 4),
                            "validation_loss": round(validation_loss, 4),
                            "seconds": round(elapsed, 1)})
            is_best = best is None or validation_loss < best["validation_loss"]
            if is_best:
                best = {"step": step, "validation_loss": validation_loss,
                        "state": {k: v.detach().clone() for k, v in model.state_dict().items()}}
            log(f"step {step:6d}/{total_steps}  lr {learning_rate(args, step - 1, total_steps):.2e}"
                f"  train batch {loss.item():.4f}  val {validation_loss:.4f}"
                f"{'  *' if is_best else ''}  {elapsed:6.1f} s")
    torch.cuda.synchronize()
    seconds = time.time() - start
    model.load_state_dict(best["state"])
    result = {
        "steps_run": total_steps, "best_step": best["step"], "training_seconds": round(seconds, 1),
        "tokens_per_step": args.batch * args.context,
        "train_loss": round(evaluate(torch, model, train_sample, args.batch), 4),
        "validation_loss": round(best["validation_loss"], 4),
        "history": history, "parameters": actual,
        "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
    }
    return model, result


def main():
    parser, args = parse_arguments()
    if args.card_from:
        run = pathlib.Path(args.card_from)
        result = json.loads((run / "metrics.json").read_text())
        samples = json.loads((run / "samples.json").read_text())
        (run / "model" / "README.md").write_text(
            model_card.render(argparse.Namespace(**result["arguments"]), result, samples))
        return
    out = pathlib.Path(args.out)
    model_dir = out / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    log_file = open(out / "train.log", "a", encoding="utf-8")

    def log(message):
        print(message, flush=True)
        log_file.write(message + "\n")
        log_file.flush()
    log(f"command: {' '.join(sys.argv)}")

    data = corpus.load(args.text, args.validation_fraction, args.chat_fraction, args.seed)
    train_chars = sum(len(t) for t in data["train_texts"])
    validation_chars = sum(len(t) for t in data["validation_texts"])
    chat_chars = sum(len(c) for c in data["chats"])
    log(f"text: {', '.join(data['names'])}: {sum(data['paragraphs'])} paragraphs; train "
        f"{train_chars} chars, validation {validation_chars} chars, chat {len(data['chats'])} of "
        f"{data['chats_available']} conversations, {chat_chars} chars")
    parameters = parameter_count(args)
    estimate = 2 * parameters + 400_000  # bf16 weights + tokenizer files and card (generous)
    log(f"model: Llama, {parameters} parameters ({parameters / 1e6:.2f} M), bf16 weights "
        f"{2 * parameters} bytes, directory estimate {estimate} bytes (cap {args.max_dir_bytes})")
    if estimate > args.max_dir_bytes:
        raise SystemExit("the model would not fit the size cap; shrink it")
    result = {"parameters": parameters, "arguments": vars(args), "command": " ".join(sys.argv),
              "train_chars": train_chars, "validation_chars": validation_chars,
              "chat_chars": chat_chars, "chat_conversations": len(data["chats"]),
              "python": platform.python_version()}
    if args.dry_run:
        result["command"] = reproduce_command(parser, args, args.steps)
        card = model_card.render(args, result, samples=[], dry_run=True)
        (model_dir / "README.md").write_text(card)
        log(f"dry run: wrote {model_dir / 'README.md'}; example chat document:\n{data['chats'][0]}")
        return

    started = time.time()
    tokenizer = train_tokenizer(args, data["train_texts"], model_dir)
    train_tokens, validation_tokens = token_streams(tokenizer, data)
    result["train_tokens"], result["validation_tokens"] = len(train_tokens), len(validation_tokens)
    result["tokenizer_seconds"] = round(time.time() - started, 1)
    log(f"tokenizer: {tokenizer.get_vocab_size()} tokens in {result['tokenizer_seconds']} s; "
        f"train stream {len(train_tokens)} tokens "
        f"({train_chars / len(train_tokens):.2f} chars/token with chats), "
        f"validation {len(validation_tokens)} tokens")

    model, trained = train(args, train_tokens, validation_tokens, log)
    result.update(trained)
    log(f"trained {result['steps_run']} steps in {result['training_seconds']} s on "
        f"{result['device']}; best val {result['validation_loss']} at step {result['best_step']}, "
        f"train {result['train_loss']}")
    result["command_run"], result["command"] = result["command"], reproduce_command(
        parser, args, result["steps_run"])
    samples = check_model.save_and_check(args, model, tokenizer, validation_tokens, model_dir,
                                         result, log)
    (model_dir / "README.md").write_text(model_card.render(args, result, samples))
    result["files"] = {p.name: p.stat().st_size for p in sorted(model_dir.iterdir())}
    result["directory_bytes"] = sum(result["files"].values())
    log(f"files: {result['files']}; total {result['directory_bytes']} bytes")
    (out / "metrics.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "samples.json").write_text(json.dumps(samples, indent=2, ensure_ascii=False) + "\n")
    with open(out / "samples.txt", "w", encoding="utf-8") as handle:
        for sample in samples:
            for key in ("prompt", "greedy", "temperature_0.8"):
                handle.write(f"--- {key}\n{sample[key]}\n")
            handle.write("\n")
    for sample in samples:
        log(f"=== {sample['prompt']!r}\n[greedy] {sample['greedy']}\n"
            f"[t=0.8] {sample['temperature_0.8']}")
    if result["directory_bytes"] > args.max_dir_bytes:
        raise SystemExit(f"model directory {result['directory_bytes']} bytes > cap")


if __name__ == "__main__":
    main()
