"""The model card (README.md) of the embedded default model, filled in with one run's figures.

train.py calls render() after training with the run's metrics and samples, so the card in
models/austen-*/ always states what that very run did: data, tokenizer, architecture, training
settings, losses, time and device, sample outputs, the command that trains it again, the license
and the limitations. With dry_run=True the figures are placeholders (to check the layout).
"""

import textwrap


def _figure(result, key, dry_run, unit=""):
    if dry_run or key not in result:
        return "(dry run)"
    return f"{result[key]}{unit}"


def _history_rows(result):
    history = result.get("history", [])
    if len(history) > 12:  # about ten rows, always the last one
        stride = len(history) // 10
        rows = history[stride - 1::stride][:10]
        history = rows + ([history[-1]] if rows[-1] is not history[-1] else [])
    return "\n".join(f"| {h['step']} | {h['seconds']} | {h['train_batch_loss']} | "
                     f"{h['validation_loss']} |" for h in history)


def _samples(samples):
    blocks = []
    for sample in samples:
        prompt = sample["prompt"].replace("\n", "\\n")
        blocks.append(f"**Prompt** `{prompt}`\n\n"
                      f"Greedy:\n\n{_quote(sample['prompt'] + sample['greedy'])}\n\n"
                      f"Temperature 0.8:\n\n{_quote(sample['prompt'] + sample['temperature_0.8'])}")
    return "\n\n".join(blocks) if blocks else "(dry run: no samples)"


def _quote(text):
    return "\n".join("> " + line if line else ">" for line in text.split("\n"))


def render(args, result, samples, dry_run=False):
    figure = lambda key, unit="": _figure(result, key, dry_run, unit)  # noqa: E731
    parameters = result["parameters"]
    epochs = "(dry run)"
    if not dry_run:
        epochs = f"{result['steps_run'] * result['tokens_per_step'] / result['train_tokens']:.1f}"
    command = result["command"]
    history = _history_rows(result) if not dry_run else "| (dry run) | | | |"
    return textwrap.dedent(f"""\
    ---
    license: mit
    language: en
    library_name: transformers
    pipeline_tag: text-generation
    tags: [llama, toy, from-scratch, jane-austen, pagedattn]
    ---
    # {args.name}

    A {parameters / 1e6:.2f}-million-parameter Llama-architecture language model trained from
    scratch on the six novels of Jane Austen. It is the embedded default model of pagedattn:
    `pagedattn generate` with no `--model` runs it on the CPU, so that a fresh checkout shows a
    model writing text without downloading anything. It writes Austen-flavoured English; it knows
    nothing else.

    ## Training data
    *Sense and Sensibility*, *Pride and Prejudice*, *Mansfield Park*, *Emma*, *Northanger Abbey*
    and *Persuasion* (Project Gutenberg editions; public domain) as shipped by the Debian package
    `r-cran-janeaustenr` (Julia Silge's R package janeaustenr, MIT license), exported to plain text
    by `scripts/embedded-model/export-austen.sh`: paragraphs kept (the lines of a paragraph joined),
    the underscores that mark italics removed. The validation text is 1% of each novel's
    paragraphs, a block at the middle of the novel, never trained on (tokenizer included):
    {figure('validation_chars')} characters, {figure('validation_tokens')} tokens. The training
    text is the rest ({figure('train_chars')} characters), plus {figure('chat_conversations')}
    short conversations ({figure('chat_chars')} characters) made from consecutive paragraphs of
    quoted speech in the training text, rendered with the chat template below, so that an
    assistant turn ends with `<|endoftext|>`. Training stream: {figure('train_tokens')} tokens.

    ## Tokenizer
    Byte-level BPE trained with Hugging Face `tokenizers` on the training text: {args.vocab} tokens
    (256 bytes, 3 special tokens, the rest merges), the Llama-3 split regex then the ByteLevel
    pre-tokenizer, ByteLevel decoder, no normalizer, no post-processor. The vocabulary is small
    because the embedding matrix (vocab x hidden, tied with the output layer) is a third of the
    model at this size. Special tokens: `<|endoftext|>` (id 0: bos, eos and pad; it separates the
    novels and ends an assistant turn), `<|user|>` (1), `<|assistant|>` (2). No BOS is added to a
    prompt (`add_bos_token: false`): the model was trained on windows that start anywhere.
    Chat template (`tokenizer_config.json`): a user turn is `<|user|>\\n` + text + `\\n`, an
    assistant turn `<|assistant|>\\n` + text + `<|endoftext|>`, a system message its text and a
    blank line; the generation prompt is `<|assistant|>\\n`.

    ## Architecture
    `LlamaForCausalLM`: hidden {args.hidden}, {args.layers} layers, {args.heads} query heads and
    {args.kv_heads} key/value head(s) of dimension {args.head_dim} (grouped-query attention),
    SwiGLU MLP of {args.intermediate}, RMSNorm (eps 1e-5), RoPE (theta 10000, default scaling),
    context {args.context} tokens, embeddings tied to the output layer, no biases.
    {parameters} parameters, stored in bf16 (`model.safetensors`).

    ## Training
    From scratch with PyTorch {figure('torch')} and transformers {figure('transformers')} on one
    {figure('device')}: {figure('steps_run')} steps of {args.batch} random windows of
    {args.context} tokens ({epochs} epochs of the training stream), bf16 autocast, AdamW
    (betas 0.9/0.95, weight decay {args.weight_decay} on matrices), learning rate {args.lr} with
    {args.warmup} warm-up steps then cosine decay to {args.lr * args.min_lr_ratio:g}, gradient
    clipping 1.0, residual dropout {args.dropout} (training only), seed {args.seed}. The
    validation loss was measured every {args.eval_every} steps and the best checkpoint kept (step
    {figure('best_step')}). These settings had the lowest validation loss of the few runs
    compared in `scripts/embedded-model/README.md` (the corpus is small: longer training
    overfits). Training took {figure('training_seconds', ' s')} (tokenizer
    {figure('tokenizer_seconds', ' s')}).

    | step | seconds | train batch loss | validation loss |
    | --- | --- | --- | --- |
    {{history}}

    ## Results (nats per token)
    - train loss (64 fixed training windows, no dropout): {figure('train_loss')}
    - validation loss: {figure('validation_loss')} (bf16 autocast during training);
      {figure('validation_loss_bf16_weights')} for the saved bf16 weights computed in float32,
      that is {figure('validation_bits_per_byte')} bits per byte of text.

    ## Samples
    From the saved model reloaded with `AutoModelForCausalLM` (float32 compute), greedy (60
    tokens) and temperature 0.8 with no other truncation (120 tokens, seeded), stopping at
    `<|endoftext|>`. The last prompt is a chat rendered with the template.

    {{samples}}

    ## Train it again
    ```
    sudo apt-get install r-cran-janeaustenr
    scripts/embedded-model/export-austen.sh /tmp/austen-text
    # on a CUDA machine with torch, transformers and tokenizers:
    {command}
    ```
    The result is the same up to GPU non-determinism (same text, same seed).

    ## License
    The novels are in the public domain. The weights, the tokenizer and the training scripts
    are released under the MIT license, like the janeaustenr package the text comes from.

    ## Limitations
    A toy: a few million parameters trained on about a million tokens of one author. It writes
    sentences with Austen's vocabulary, names and rhythm, mostly grammatical over a clause or two,
    but it loses the thread within a few sentences, invents events, repeats itself under greedy
    decoding, and knows nothing of the world beyond the novels. It is not an assistant: the chat
    template only makes it answer a quoted line with another. Use it to see pagedattn run, not for
    anything that needs its text to be true or useful.
    """).replace("{history}", history).replace("{samples}", _samples(samples))
