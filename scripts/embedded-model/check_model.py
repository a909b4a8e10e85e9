"""Saves the trained model, reloads it with transformers' Auto classes, checks it, samples it.

The model goes out in bf16 through save_pretrained (config.json, generation_config.json,
model.safetensors; the tokenizer files are already there). It is then read back exactly as a user
would read it (AutoModelForCausalLM in float32, AutoTokenizer) to measure the validation loss of
the weights that ship, to check that transformers tokenizes and renders the chat template as
train.py and corpus.py do and that `generate` agrees with a plain greedy loop, and to write the
samples of the model card: greedy and temperature 0.8 (no top-k / top-p), seeded.
"""

import json
import math

import corpus

PROMPTS = ["It is a truth universally", "Elizabeth", "Mr. Darcy", "Emma Woodhouse,",
           "\"My dear Fanny,"]
CHAT_PROMPT = [{"role": "user", "content": "\"Pray, what do you think of Mr. Darcy?\""}]


def validation_windows(torch, validation, context, device):
    """Non-overlapping windows of context + 1 tokens (consecutive windows share one token)."""
    count = (len(validation) - 1) // context
    tensor = torch.tensor(validation[:count * context + 1], dtype=torch.long, device=device)
    return torch.stack([tensor[i * context:(i + 1) * context + 1] for i in range(count)])


def save_and_check(args, model, tokenizer, validation_tokens, model_dir, result, log):
    """Saves bf16 weights, reloads the directory with transformers' Auto classes, samples."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    model.generation_config = GenerationConfig(
        bos_token_id=0, eos_token_id=0, pad_token_id=0, do_sample=True, temperature=0.8,
        top_p=0.95, max_length=args.context)
    model.to(torch.bfloat16).save_pretrained(str(model_dir))
    config_path = model_dir / "config.json"
    config = json.loads(config_path.read_text())
    if config.get("dtype", config.get("torch_dtype")) != "bfloat16":
        config["dtype"] = "bfloat16"
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    result["transformers"] = transformers.__version__

    try:
        reloaded = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    except TypeError:
        reloaded = AutoModelForCausalLM.from_pretrained(str(model_dir), torch_dtype=torch.float32)
    reloaded = reloaded.to("cuda").eval()
    hf_tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    windows = validation_windows(torch, validation_tokens, args.context, "cuda")
    with torch.no_grad():
        total = 0.0
        for row in windows:
            logits = reloaded(input_ids=row[None, :-1], use_cache=False).logits.float()[0]
            total += torch.nn.functional.cross_entropy(logits, row[1:], reduction="sum").item()
    tokens = windows[:, 1:].numel()
    text_bytes = sum(len(tokenizer.decode(row[1:].tolist()).encode()) for row in windows)
    result["validation_loss_bf16_weights"] = round(total / tokens, 4)
    result["validation_bits_per_byte"] = round(total / text_bytes / math.log(2), 4)
    log(f"shipped bf16 weights, float32 compute: val loss {total / tokens:.4f} nats/token, "
        f"{result['validation_bits_per_byte']:.4f} bits/byte "
        f"({text_bytes / tokens:.2f} bytes/token)")

    checks = []
    probe = "It is a truth universally acknowledged, that a single man"
    checks.append(("AutoTokenizer encodes as tokenizers does",
                   hf_tokenizer(probe)["input_ids"] == tokenizer.encode(probe).ids))
    rendered = hf_tokenizer.apply_chat_template(CHAT_PROMPT, tokenize=False,
                                                add_generation_prompt=True)
    checks.append(("apply_chat_template renders as corpus.render_chat",
                   rendered == corpus.render_chat(CHAT_PROMPT, add_generation_prompt=True)))

    def continue_text(prompt_ids, count, temperature, seed):
        generator = torch.Generator(device="cuda").manual_seed(seed)
        ids = torch.tensor([prompt_ids], device="cuda")
        with torch.no_grad():
            for _ in range(count):
                logits = reloaded(input_ids=ids[:, -args.context:], use_cache=False).logits
                logits = logits[0, -1].float()
                if temperature == 0:
                    next_id = logits.argmax()
                else:
                    probabilities = torch.softmax(logits / temperature, dim=-1)
                    next_id = torch.multinomial(probabilities, 1, generator=generator)[0]
                ids = torch.cat([ids, next_id.view(1, 1)], dim=1)
                if next_id.item() == 0:
                    break
        return ids[0, len(prompt_ids):].tolist()

    samples = []
    for index, prompt in enumerate(PROMPTS + [None]):
        text = prompt if prompt is not None else rendered
        prompt_ids = tokenizer.encode(text).ids
        greedy = continue_text(prompt_ids, 60, 0.0, 0)
        sampled = continue_text(prompt_ids, 120, 0.8, args.seed + index)
        samples.append({"prompt": text,
                        "greedy": tokenizer.decode(greedy, skip_special_tokens=False),
                        "temperature_0.8": tokenizer.decode(sampled, skip_special_tokens=False)})
        if index == 0:
            try:
                generated = reloaded.generate(
                    torch.tensor([prompt_ids], device="cuda"), max_new_tokens=len(greedy),
                    do_sample=False, pad_token_id=0)
                checks.append(("model.generate greedy equals the manual greedy loop",
                               generated[0, len(prompt_ids):].tolist() == greedy))
            except Exception as error:  # a check, not a reason to lose the run
                checks.append((f"model.generate failed: {error!r}", False))
    result["checks"] = [{"check": name, "passed": bool(ok)} for name, ok in checks]
    for name, ok in checks:
        log(f"check: {'ok  ' if ok else 'FAIL'} {name}")
    return samples
